"""The futures the pool returns, and the thread that runs their done-callbacks.

Owns: ``PoolFuture`` and one ``CallbackRunner`` per pool.
Runs in: futures are touched by every thread; callbacks that a result, exception or
cancellation set *on the dispatcher thread* would trigger run on the runner's thread.
Guarantees: no done-callback ever runs on the dispatcher thread, so a callback that blocks
or raises cannot delay other results or teardown. A callback that raises anything, even
``SystemExit`` or ``KeyboardInterrupt``, is logged and the next one runs.
Assumes: ``concurrent.futures.Future`` runs callbacks through ``_invoke_callbacks()``
(true from 3.2 to 3.14; ``tests/test_futures.py`` pins it).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger("pool")

# Set on the dispatcher thread only: the runner that takes its callbacks.
_dispatcher_local = threading.local()


class PoolFuture(Future[Any]):
    """A ``concurrent.futures.Future`` whose callbacks never run on the dispatcher thread."""

    def _invoke_callbacks(self) -> None:
        runner: CallbackRunner | None = getattr(_dispatcher_local, "runner", None)
        if runner is None:
            _run_callbacks(self)  # a caller's thread (cancel()): run them here, as stdlib
        elif self._done_callbacks:  # type: ignore[attr-defined]
            runner.put(self)


def _run_callbacks(future: Future[Any]) -> None:
    for callback in list(future._done_callbacks):  # type: ignore[attr-defined]
        try:
            callback(future)
        except BaseException:
            logger.exception("done-callback %r of %r raised", callback, future)


class CallbackRunner:
    """A daemon thread that runs the callbacks of futures resolved by the dispatcher."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Future[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, future: Future[Any]) -> None:
        if self._thread is None:
            # A daemon: a callback that never returns must not keep the interpreter alive.
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(future)

    def _run(self) -> None:
        while (future := self._queue.get()) is not None:
            _run_callbacks(future)
            del future

    def close(self) -> None:
        """Let the thread run the callbacks already queued, then exit (not joined here)."""
        if self._thread is not None:
            self._queue.put(None)

    def join(self) -> None:
        """Wait until every queued callback has run (unless called from one of them)."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


def install_on_dispatcher_thread(runner: CallbackRunner) -> None:
    _dispatcher_local.runner = runner

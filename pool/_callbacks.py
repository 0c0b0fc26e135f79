"""Where the done-callbacks of futures run: one ``CallbackRunner`` per pool, whose threads
take the callbacks of the futures its dispatcher resolves.

Owns: each runner's threads and queue, and which runner the dispatcher thread hands its
callbacks to (``install_on_dispatcher_thread``).
Runs in: ``put`` on the dispatcher thread; the callbacks on the runner's threads;
``close`` and ``join`` on the thread that ends the pool.
Guarantees:
- no done-callback ever runs on the dispatcher thread, so a callback that blocks or raises
  cannot delay results or teardown. A callback that blocks does not hold up the callbacks
  of other futures either: while all of the runner's threads are busy, it starts another,
  up to ``MAX_CALLBACK_THREADS``. One that raises anything, even ``SystemExit`` or
  ``KeyboardInterrupt``, is logged and the next one runs;
- a future's callbacks run in the order they were added, once;
- callbacks queued when no thread could start, at interpreter exit, run in ``join()``;
  work that a runner thread queues itself once the runner is closed runs on that thread,
  after its current callback.
Assumes: a ``Future`` keeps its callbacks in ``_done_callbacks``, as the stdlib's does
from 3.2 to 3.14, and a future is done, its list complete, when it is handed here.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from ._latch import join_interruptibly
from ._locks import InterruptSafeLock

logger = logging.getLogger("pool")

# Set on the dispatcher thread only: the runner that takes its callbacks.
_dispatcher_local = threading.local()

# Callback threads a pool may have at once; beyond this, callbacks wait for a free one.
MAX_CALLBACK_THREADS = 16
# Only a callback running this long counts as blocked in the warning: under a burst of
# results every thread is busy for a moment, which is load, not a callback that hangs.
BLOCKED_CALLBACK_SECONDS = 1.0


class _Call:
    """A function to run on a runner thread (``CallbackRunner.call``), queued as a future
    with callbacks is."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn


def run_callbacks(future: Future[Any] | _Call) -> None:
    """Runs ``future``'s done-callbacks here, in order, logging any that raises (or the
    function a ``_Call`` carries)."""
    if isinstance(future, _Call):
        try:
            future.fn()
        except BaseException:
            logger.exception("%r, run on a callback thread, raised", future.fn)
        return
    for callback in list(future._done_callbacks):  # type: ignore[attr-defined]
        try:
            callback(future)
        except BaseException:
            logger.exception("done-callback %r of %r raised", callback, future)


class CallbackRunner:
    """Daemon threads that run the callbacks of futures resolved by the dispatcher.

    One thread while callbacks are quick. Another starts whenever every thread is busy, as
    when a callback blocks, so one callback never holds up another future's.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Future[Any] | _Call | None] = queue.SimpleQueue()
        self._lock = InterruptSafeLock()
        self._threads: list[threading.Thread] = []
        self._idle = 0      # threads waiting for a future
        self._backlog = 0   # futures queued and not yet taken by a thread
        self._warned = False
        self._running_since: dict[int, float] = {}   # thread ident -> its callback's start
        # On each of the runner's threads: what it queued itself once the runner was
        # closed (a pool.Pool chunk that ended there hands on its result's callback). That
        # runs on the same thread once its callback returns: never lost behind close()'s
        # markers. While the runner is open, such work goes to the queue like any other,
        # where another thread can take it (the callback may be waiting for it).
        self._own = threading.local()
        self._closed = False

    def put(self, future: Future[Any] | _Call) -> None:
        own: list[Future[Any] | _Call] | None = getattr(self._own, "queued", None)
        with self._lock:
            if own is not None and self._closed:  # one of our threads, after close()
                own.append(future)
                return
            self._queue.put(future)
            self._backlog += 1
            if self._backlog <= self._idle:
                return
            if len(self._threads) >= MAX_CALLBACK_THREADS:
                oldest = min(self._running_since.values(), default=math.inf)
                if not self._warned and time.monotonic() - oldest >= BLOCKED_CALLBACK_SECONDS:
                    self._warned = True
                    logger.warning("%s: all %d callback threads are busy and one "
                                   "done-callback has run for %.0f s or more; later "
                                   "callbacks wait for a thread to be free", self._name,
                                   len(self._threads), BLOCKED_CALLBACK_SECONDS)
                return
            # Daemons: a callback that never returns must not keep the interpreter alive.
            thread = threading.Thread(target=self._run, daemon=True,
                                      name=f"{self._name}-{len(self._threads) + 1}")
            self._threads.append(thread)
            self._idle += 1
            try:
                thread.start()
            except RuntimeError:
                # No thread can start once the interpreter is shutting down; 3.12 refuses
                # even while threading's exit hooks run. The future stays queued, and the
                # exit's join() runs its callbacks (see _run_leftovers).
                self._threads.remove(thread)
                self._idle -= 1

    def call(self, fn: Callable[[], object]) -> None:
        """Runs ``fn()`` on one of the runner's threads, as a done-callback runs (logged if
        it raises): for what must not run on the calling thread even when it could run at
        once."""
        self.put(_Call(fn))

    def _run(self) -> None:
        queued: list[Future[Any] | _Call] = []
        self._own.queued = queued
        while True:
            future = self._queue.get()
            with self._lock:
                self._idle -= 1
                if future is None:
                    return
                self._backlog -= 1
                self._running_since[threading.get_ident()] = time.monotonic()
            run_callbacks(future)
            while queued:
                run_callbacks(queued.pop(0))
            del future
            with self._lock:
                del self._running_since[threading.get_ident()]
                self._idle += 1

    def close(self) -> None:
        """Lets the threads run the callbacks already queued, then exit. Not joined here."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)

    def join(self, timeout: float | None = None) -> list[threading.Thread]:
        """Wait until every queued callback has run (unless called from one of them), or
        ``timeout`` passes; returns the threads still running a callback."""
        with self._lock:
            threads = [t for t in self._threads if t is not threading.current_thread()]
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if deadline is None:
                join_interruptibly(thread)
            else:
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            never_started = not self._threads
        if never_started:
            self._run_leftovers()
        return [t for t in threads if t.is_alive()]

    def _run_leftovers(self) -> None:
        """Runs, in the joining thread, callbacks queued when no thread could be started
        for them, at interpreter exit. With no runner thread, nobody else would."""
        while True:
            try:
                future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future is not None:
                with self._lock:
                    self._backlog -= 1
                run_callbacks(future)


def install_on_dispatcher_thread(runner: CallbackRunner) -> None:
    """Makes ``runner`` take the callbacks of the futures this thread resolves. Called by
    the dispatcher thread, once, as it starts."""
    _dispatcher_local.runner = runner


def runner_of_this_thread() -> CallbackRunner | None:
    """The runner installed on this thread: set on a dispatcher thread, None elsewhere."""
    return getattr(_dispatcher_local, "runner", None)

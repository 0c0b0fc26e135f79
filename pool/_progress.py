"""Progress reporting without a dependency: ``map(..., progress=bar)`` and
``as_completed(fs, progress=bar)`` call ``bar.update(n)`` with counts of items done.

Owns: one ``Progress`` per call that is given a progress object, and the thread that calls
it.
Runs in: futures report from whatever thread resolves them. A pool future reports through
its ``_when_done`` hook on the dispatcher thread, which only puts a number on a queue; any
other future, through a done-callback. The progress object itself is called only on the
``Progress``'s own thread, one call at a time, with the counts that arrived meanwhile
added together. So a burst of results is one ``update``, and there is at most one every
``UPDATE_SECONDS`` while counts keep coming.
Guarantees: a progress object that is slow or blocks delays no result and never runs on
the pool's thread. Counts are items: a ``map`` chunk of 100 counts 100. They count tasks
that finished, failed or not; cancelled ones are not counted. When the caller has seen
every result, ``finish`` waits a bounded time until every count was delivered, so a bar
reads 100% when the loop ends. A progress object that raises is logged once and not
called again.
Assumes: the object has ``update(n)`` (tqdm, enlighten) or is a callable taking ``n``; for
rich, ``lambda n: progress.advance(task, n)``.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent import futures
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar, Union, cast

from . import _compat
from ._futures import PoolFuture
from ._latch import Latch
from ._locks import InterruptSafeLock

# The future type given is the one yielded: pool futures come back as PoolFuture, with
# stop() and the rest of their API in a type checker's view.
F = TypeVar("F", bound="Future[Any]")

logger = logging.getLogger("pool")

# How long the end of a loop waits for a progress object to take the last counts. Past
# this the object is stuck: say so and go on. The loop's results are all delivered anyway.
FINISH_SECONDS = 5.0

# While counts keep arriving, the progress object is called at most once per this interval.
UPDATE_SECONDS = 0.02


class SupportsUpdate(Protocol):
    """What ``progress=`` takes: anything with ``update(n)``, as tqdm and enlighten have."""

    def update(self, n: int, /) -> object: ...


ProgressTarget = Union[SupportsUpdate, Callable[[int], object]]


class Progress:
    """Counts items done, from any thread, and reports them on a thread of its own. That
    thread runs only while some tracked future has not been counted: a ``map`` never
    iterated, or left early, leaves no thread behind once its tasks are done."""

    def __init__(self, target: ProgressTarget) -> None:
        update = getattr(target, "update", None)
        if not callable(update):
            if not callable(target):
                raise TypeError(f"progress must have an update(n) method or be a callable "
                                f"taking n, not {target!r}")
            update = target
        self._update: Callable[[int], object] = update
        self._counts: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock = InterruptSafeLock()
        self._outstanding = 0       # futures tracked whose count is not yet delivered
        self._thread: threading.Thread | None = None
        self._drained: Latch | None = None
        self._silent = False        # finished early, or the object raised: not called again
        # Set by finish(): deliver the last counts at once. A latch, not an Event: a Ctrl-C
        # in finish() could leave an Event's lock taken, and this thread stuck on it.
        self._hurry = Latch()

    def track(self, future: Future[Any], items: int) -> None:
        """Count ``items`` once ``future`` is done (unless it was cancelled)."""
        with self._lock:
            self._outstanding += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pool-progress",
                                                daemon=True)
                self._thread.start()
        count = self._counts.put

        def counted(f: Future[Any]) -> None:
            # (Reads no lock: a done future's state is final.)
            count(0 if _compat.done_future_cancelled(f) else items)

        if isinstance(future, PoolFuture):
            # No hop through a callback thread: the pool's futures are resolved by its
            # dispatcher, which may put a number on a queue.
            future._when_done(counted)
        else:
            future.add_done_callback(counted)

    def finish(self, *, wait: bool) -> None:
        """No more futures will be tracked. With ``wait``, since the caller saw every
        result, returns once every count has been given to the progress object, or after
        ``FINISH_SECONDS`` if it is stuck. Without, later counts are not reported."""
        if not wait:
            self._silent = True
            return
        drained = Latch()
        with self._lock:
            thread = self._thread
            self._drained = drained
            self._hurry.set()
            if self._outstanding == 0:
                drained.set()
        if not drained.wait(FINISH_SECONDS):
            logger.warning("pool: the progress object has not taken the last counts in "
                           "%g s; not waiting for it", FINISH_SECONDS)
        elif thread is not None:
            thread.join(FINISH_SECONDS)  # it has nothing left to do: it ends at once

    def _run(self) -> None:
        while True:
            seen, total = 1, self._counts.get()
            while True:  # everything that arrived meanwhile: one update
                try:
                    more = self._counts.get_nowait()
                except queue.Empty:
                    break
                seen, total = seen + 1, total + more
            if total and not self._silent:
                try:
                    self._update(total)
                except BaseException:
                    self._silent = True
                    logger.exception("pool: the progress object raised; it is not called "
                                     "again")
            with self._lock:
                self._outstanding -= seen
                if self._outstanding == 0:
                    self._thread = None
                    if self._drained is not None:
                        self._drained.set()
                    return
                finishing = self._drained is not None
            if not finishing:
                # More counts to come: let them gather. Waking for each one would make
                # this thread take the GIL from the pool's thread once per task, which
                # cost a fifth of tiny-task throughput (measured). A bar needs no more
                # than this rate.
                self._hurry.wait(UPDATE_SECONDS)


def as_completed(fs: Iterable[F], timeout: float | None = None, *,
                 progress: ProgressTarget | None = None) -> Iterator[F]:
    """``concurrent.futures.as_completed``, which also tells ``progress`` as each future
    finishes. ``progress`` is an object with ``update(n)``, or a callable taking ``n``. It
    gets ``update(1)`` per future, on a thread of its own; cancelled futures are not
    counted. Works with any ``concurrent.futures`` futures, not only the pool's; each
    future yielded is one of ``fs``, with its own type (``PoolFuture`` for a pool's)."""
    if progress is None:
        # The stdlib's is typed as yielding Future; it yields the very objects given.
        return cast("Iterator[F]", futures.as_completed(fs, timeout))
    reporter = Progress(progress)  # a bad progress object fails here, at the call
    return _reporting(cast("Iterator[F]", futures.as_completed(_tracked(fs, reporter), timeout)),
                      reporter)


def _tracked(fs: Iterable[F], reporter: Progress) -> set[F]:
    unique = set(fs)
    for future in unique:
        reporter.track(future, 1)
    return unique


def _reporting(done: Iterator[F], reporter: Progress) -> Iterator[F]:
    complete = False
    try:
        yield from done
        complete = True
    finally:
        reporter.finish(wait=complete)

"""What ``pool.Pool`` hands back, as ``multiprocessing.pool`` does: ``AsyncResult``
(``apply_async``), ``MapResult`` (``map_async``, ``starmap_async``) and ``IMapIterator``
(``imap``, ``imap_unordered``), each over the pool's futures.

Owns: each result's outcome, set once, and each iterator's items not yet taken.
Runs in: callers' threads (``get``, ``wait``, ``next``); the pool's callback threads, which
run the user's ``callback`` and ``error_callback``; the dispatcher thread, which only puts
a finished chunk of ``imap_unordered`` on its queue (``PoolFuture._when_done``).
Guarantees:
- a result is ready only once its ``callback`` or ``error_callback`` has run, as with the
  stdlib; one that raises is logged and the result is ready all the same (the stdlib's
  result thread dies of it, and every later ``get()`` of that pool hangs). A result with
  neither is its futures': nothing runs on another thread to make it ready, but for a
  chunk whose worker died, which ends on a callback thread (``_mp_chunks``);
- ``get``, ``wait`` and ``next`` wait on the futures' latches or a C queue, in slices: a
  Ctrl-C always interrupts them, and leaves nothing taken that another thread needs;
- in a chunk, an item's exception fails that item alone. A worker's death or a timeout
  in a chunk of several items fails the item it was running (``_mp_chunks``); what ends a
  chunk's task otherwise (a cancelled task, or a death of which nothing was recorded)
  fails each of its items, with a copy of the same error.
Assumes: the futures are the pool's (``PoolFuture``), whose done-callbacks run off the
dispatcher thread; a chunk's future (a task's, or a ``ChunkRun``'s) gives what
``_worker.items.run_items`` returns, its failures encoded or exceptions.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import queue
import time
from concurrent.futures import CancelledError, Future
from typing import Any, Callable, Generic, TypeVar

from ._errors import copy_error
from ._futures import PoolFuture, failed_future
from ._latch import SIGNAL_CHECK_SECONDS, Latch
from ._locks import InterruptSafeLock
from ._wire.exceptions import decode_exception
from ._wire.pickling import UNPICKLABLE_RESULT

logger = logging.getLogger("pool")

T = TypeVar("T")

# An item's outcome: (True, its result) or (False, its exception).
Outcome = tuple[bool, Any]


def outcome_of(future: PoolFuture[Any]) -> Outcome:
    """A done task's outcome; a cancelled one fails with CancelledError (the stdlib's
    results of a terminated pool never become ready)."""
    try:
        error = future.exception(timeout=0)
    except CancelledError:
        return False, CancelledError("the pool was terminated before this task ran")
    if error is not None:
        return False, _as_the_stdlib_reports(error)
    return True, future.result(timeout=0)


def _as_the_stdlib_reports(error: BaseException) -> BaseException:
    """A return value the worker could not pickle is ``multiprocessing.pool``'s
    ``MaybeEncodingError``, as with the stdlib's pool, caused by the pickling error."""
    value_type = getattr(error, UNPICKLABLE_RESULT, None)
    if value_type is None:
        return error
    import multiprocessing.pool
    # (Public in the module, undocumented, and missing from typeshed.)
    encoding_error: type[BaseException] = getattr(multiprocessing.pool, "MaybeEncodingError")
    wrapped = encoding_error(error, f"<a {value_type} the worker could not pickle>")
    wrapped.__cause__ = error
    return wrapped


def chunk_outcomes(future: PoolFuture[Any], size: int) -> list[Outcome]:
    """Each item's outcome, from a done chunk task (``run_items``)."""
    ok, value = outcome_of(future)
    if not ok:
        return [(False, value if index == 0 else copy_error(value)) for index in range(size)]
    values, failures = value
    outcomes: list[Outcome] = [(True, item) for item in values]
    for index, failed in failures:  # encoded by the worker, or the parent's own error
        outcomes[index] = (False, decode_exception(failed) if isinstance(failed, bytes)
                           else _as_the_stdlib_reports(failed))
    return outcomes


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class AsyncResult(Generic[T]):
    """What ``apply_async`` returns: ``get``, ``wait``, ``ready`` and ``successful``, as
    ``multiprocessing.pool.AsyncResult``. ``get(timeout)`` raises
    ``multiprocessing.TimeoutError`` if the result is not ready in time."""

    def __init__(self, futures: list[PoolFuture[Any]],
                 callback: Callable[[Any], object] | None,
                 error_callback: Callable[[BaseException], object] | None,
                 run_later: Callable[[Callable[[], object]], None] | None = None) -> None:
        self._futures = futures
        self._outcome: Outcome | None = None
        # With a callback, ready means "its callback has run": a latch the callback thread
        # sets after it. Without one, ready is the futures' own state.
        self._ran: Latch | None = None
        if callback is not None or error_callback is not None:
            assert run_later is not None
            self._ran = Latch()
            self._callback, self._error_callback = callback, error_callback
            self._run_later = run_later
            self._left = len(futures)
            self._left_lock = InterruptSafeLock()  # callback threads only
            # A future already done would run a done-callback here, on the caller's thread
            # (inside apply_async, maybe holding a lock the callback takes): a hook hands
            # it to a callback thread instead, wherever the future ends.
            for future in futures:
                future._when_done(self._hand_over)
            if not futures:
                self._ran.set()

    def ready(self) -> bool:
        """Whether the task has ended (and its callback has run)."""
        if self._ran is not None:
            return self._ran.is_set
        return all(future.done() for future in self._futures)

    def successful(self) -> bool:
        """Whether it ended with a result; ``ValueError`` if it has not ended."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._get_outcome()[0]

    def wait(self, timeout: float | None = None) -> None:
        """Wait until it has ended, or ``timeout`` seconds."""
        if self._ran is not None:
            self._ran.wait(timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        for future in self._futures:
            if not future._wait_done(_remaining(deadline)):
                return

    def get(self, timeout: float | None = None) -> T:
        """The result, or the task's exception raised; ``multiprocessing.TimeoutError``
        if it is not ready within ``timeout`` seconds."""
        self.wait(timeout)
        if not self.ready():
            raise multiprocessing.TimeoutError
        ok, value = self._get_outcome()
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def _get_outcome(self) -> Outcome:
        """The outcome, once ready (computed once: every ``get()`` sees the same)."""
        if self._outcome is None:
            self._outcome = self._compute_outcome()
        return self._outcome

    def _compute_outcome(self) -> Outcome:
        return outcome_of(self._futures[0])

    def _hand_over(self, _future: Future[Any]) -> None:
        # On the thread that ended the future (the dispatcher's: a put on a queue, nothing
        # more), or on the caller's, for a future done before this was registered.
        self._run_later(self._one_done)

    def _one_done(self) -> None:
        """Once per future, on a callback thread: the user's callback, once all are done."""
        with self._left_lock:
            self._left -= 1
            if self._left:
                return
        assert self._ran is not None
        ok, value = self._get_outcome()
        callback = self._callback if ok else self._error_callback
        try:
            if callback is not None:
                callback(value)
        except BaseException:
            logger.exception("%s %r of %r raised", "callback" if ok else "error_callback",
                             callback, self)
        finally:
            self._callback = self._error_callback = None
            self._ran.set()


class MapResult(AsyncResult[list[T]]):
    """What ``map_async`` and ``starmap_async`` return: ready once every chunk has ended.
    ``get()`` gives the results in input order, or raises the first exception to arrive,
    as the stdlib's does; ``callback`` gets the list, ``error_callback`` that exception."""

    def __init__(self, chunks: list[PoolFuture[Any]], sizes: list[int],
                 callback: Callable[[Any], object] | None,
                 error_callback: Callable[[BaseException], object] | None,
                 run_later: Callable[[Callable[[], object]], None] | None = None) -> None:
        self._sizes = sizes
        # The chunks as they end, put there by the thread that ends each (see _when_done):
        # which failure arrived first. (Chunks done before this was registered come in
        # input order: they ended while their call was being made.)
        self._arrivals: collections.deque[Future[Any]] = collections.deque()
        for future in chunks:
            future._when_done(self._arrivals.append)
        super().__init__(chunks, callback, error_callback, run_later)

    def _compute_outcome(self) -> Outcome:
        values: list[Any] = []
        failed: dict[int, BaseException] = {}  # by chunk
        for number, (future, size) in enumerate(zip(self._futures, self._sizes)):
            ok, value = outcome_of(future)
            if ok and not value[1]:  # a chunk whose every item gave a value: as it is
                values.extend(value[0])
                continue
            for ok, value in chunk_outcomes(future, size):
                values.append(value if ok else None)
                if not ok and number not in failed:
                    failed[number] = value
        if not failed:
            return True, values
        number_of = {id(future): number for number, future in enumerate(self._futures)}
        # In the order they arrived; one whose hook had not run yet when we looked, last.
        arrived = [number_of[id(future)] for future in list(self._arrivals)]
        order = arrived + sorted(set(failed) - set(arrived))
        return False, next(failed[number] for number in order if number in failed)


class IMapIterator(Generic[T]):
    """What ``imap`` (in input order) and ``imap_unordered`` (as they finish) return.
    ``next(timeout)`` raises ``multiprocessing.TimeoutError`` if no result comes in time.
    An item that failed raises its exception at its place; the next ``next()`` goes on
    with the item after it (the stdlib's chunked ``imap`` ends at the first failure).

    State a Ctrl-C cannot tear: chunks wait in ``_arrived`` until they are done with and
    are only peeked at meanwhile; the chunk being handed out is replaced whole, in one
    assignment with no call in it; a chunk is dropped from ``_arrived`` only if it is still
    the head. An interrupt may lose the item being returned, never the iterator's place.
    """

    def __init__(self, ordered: bool) -> None:
        self._ordered = ordered
        # (start, size, future) for each chunk: from the feeder as it submits them
        # (ordered), or as they end (unordered); (-1, length, None) once the feeder knows
        # how many items there are. Appended by one thread, taken by the consumer.
        self._arrived: collections.deque[tuple[int, int, PoolFuture[Any] | None]] = (
            collections.deque())
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()  # rung after each append
        self._head: tuple[int, int, PoolFuture[Any] | None] | None = None
        self._outcomes: list[Outcome] = []
        self._position = 0
        self._passed = 0           # items of the chunks done with
        self._length: int | None = None
        self._lock = InterruptSafeLock()  # consumers only: one next() at a time

    def __iter__(self) -> IMapIterator[T]:
        return self

    def next(self, timeout: float | None = None) -> T:
        """The next result (or the next item's exception, raised); ``StopIteration`` after
        the last; ``multiprocessing.TimeoutError`` if none comes within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._lock.try_acquire(_slice(deadline)):
            if deadline is not None and time.monotonic() >= deadline:
                raise multiprocessing.TimeoutError
        try:
            ok, value = self._take(deadline)
        finally:
            self._lock.release()
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    __next__ = next

    def _take(self, deadline: float | None) -> Outcome:
        while True:
            head = self._head
            if head is not None:
                position = self._position
                if position < len(self._outcomes):
                    self._position = position + 1
                    return self._outcomes[position]
                if self._arrived and self._arrived[0] is head:
                    self._arrived.popleft()
                self._head, self._passed = None, self._passed + head[1]
                continue
            if not self._arrived:
                if self._length is not None and self._passed >= self._length:
                    raise StopIteration
                self._wait_for_arrival(deadline)
                continue
            entry = self._arrived[0]
            start, size, future = entry
            if future is None:  # the length, once the feeder knows it
                self._length = size
                self._arrived.popleft()
                continue
            if not future._wait_done(_remaining(deadline)):
                raise multiprocessing.TimeoutError
            outcomes = chunk_outcomes(future, size)
            self._head, self._outcomes, self._position = entry, outcomes, 0

    def _wait_for_arrival(self, deadline: float | None) -> None:
        try:
            left = _slice(deadline)
            if left > 0:
                self._bell.get(timeout=left)
            else:
                self._bell.get_nowait()
        except queue.Empty:
            if deadline is not None and time.monotonic() >= deadline and not self._arrived:
                raise multiprocessing.TimeoutError from None

    # -- the feeder's side -----------------------------------------------------------------

    def _arrive(self, entry: tuple[int, int, PoolFuture[Any] | None]) -> None:
        self._arrived.append(entry)
        self._bell.put(None)

    def _submitted(self, start: int, size: int, future: PoolFuture[Any]) -> None:
        if self._ordered:
            self._arrive((start, size, future))
        else:  # as it ends, on the thread that ends it: an append and a put, nothing more
            future._when_done(lambda _: self._arrive((start, size, future)))

    def _failed_at(self, start: int, error: BaseException) -> None:
        """The input could not go on from item ``start``: that item fails, the last."""
        self._submitted(start, 1, failed_future(error))
        self._ended(start + 1)

    def _ended(self, length: int) -> None:
        self._arrive((-1, length, None))


def _slice(deadline: float | None) -> float:
    """How long one wait may block: a slice, so a pending Ctrl-C is raised in time."""
    if deadline is None:
        return SIGNAL_CHECK_SECONDS
    return max(0.0, min(SIGNAL_CHECK_SECONDS, deadline - time.monotonic()))

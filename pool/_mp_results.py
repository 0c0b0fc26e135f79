"""What ``pool.Pool`` hands back, as ``multiprocessing.pool`` does: ``AsyncResult``
(``apply_async``), ``MapResult`` (``map_async``, ``starmap_async``) and ``IMapIterator``
(``imap``, ``imap_unordered``), each over the pool's futures.

Owns: each result's outcome, set once, and each iterator's items not yet taken.
Runs in: callers' threads (``get``, ``wait``, ``next``) and the pool's callback threads,
which resolve the results and run the user's ``callback`` and ``error_callback``.
Guarantees:
- a result is ready only once its ``callback`` or ``error_callback`` has run, as with the
  stdlib; one that raises is logged and the result is ready all the same (the stdlib's
  result thread dies of it, and every later ``get()`` of that pool hangs);
- ``get``, ``wait`` and ``next`` wait on latches or a C queue, in slices: a Ctrl-C always
  interrupts them, and leaves nothing taken that a callback thread needs;
- in a chunk, an item's exception fails that item alone; what ends the chunk's task (the
  worker's death, its timeout, a cancelled task) fails each of its items, with a copy of
  the same error.
Assumes: the futures are the pool's, whose done-callbacks run off the dispatcher thread,
and a chunk's task returns what ``_worker.items.run_items`` returns.
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
from ._latch import SIGNAL_CHECK_SECONDS, Latch
from ._locks import InterruptSafeLock
from ._wire.exceptions import decode_exception

logger = logging.getLogger("pool")

T = TypeVar("T")

# An item's outcome: (True, its result) or (False, its exception).
Outcome = tuple[bool, Any]


def outcome_of(future: Future[Any]) -> Outcome:
    """A done task's outcome; a cancelled one fails with CancelledError (the stdlib's
    results of a terminated pool never become ready)."""
    try:
        return True, future.result(timeout=0)
    except CancelledError:
        return False, CancelledError("the pool was terminated before this task ran")
    except BaseException as error:
        return False, error


def chunk_outcomes(future: Future[Any], size: int) -> list[Outcome]:
    """Each item's outcome, from a done chunk task (``run_items``)."""
    ok, value = outcome_of(future)
    if not ok:
        return [(False, value if index == 0 else copy_error(value)) for index in range(size)]
    values, failures = value
    outcomes: list[Outcome] = [(True, item) for item in values]
    for index, encoded in failures:
        outcomes[index] = (False, decode_exception(encoded))
    return outcomes


class AsyncResult(Generic[T]):
    """What ``apply_async`` returns: ``get``, ``wait``, ``ready`` and ``successful``, as
    ``multiprocessing.pool.AsyncResult``. ``get(timeout)`` raises
    ``multiprocessing.TimeoutError`` if the result is not ready in time."""

    def __init__(self, callback: Callable[[Any], object] | None,
                 error_callback: Callable[[BaseException], object] | None) -> None:
        self._ready = Latch()
        self._success = False
        self._value: Any = None
        self._callback = callback
        self._error_callback = error_callback

    def ready(self) -> bool:
        """Whether the task has ended (and its callback has run)."""
        return self._ready.is_set

    def successful(self) -> bool:
        """Whether it ended with a result; ``ValueError`` if it has not ended."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        """Wait until it has ended, or ``timeout`` seconds."""
        self._ready.wait(timeout)

    def get(self, timeout: float | None = None) -> T:
        """The result, or the task's exception raised; ``multiprocessing.TimeoutError``
        if it is not ready within ``timeout`` seconds."""
        self.wait(timeout)
        if not self.ready():
            raise multiprocessing.TimeoutError
        if self._success:
            return self._value  # type: ignore[no-any-return]
        raise self._value

    def _resolved(self, future: Future[Any]) -> None:
        """The task's done-callback (a callback thread, or the submitting thread if the
        call could not be pickled)."""
        self._set(*outcome_of(future))

    def _set(self, success: bool, value: Any) -> None:
        self._success, self._value = success, value
        callback = self._callback if success else self._error_callback
        try:
            if callback is not None:
                callback(value)
        except BaseException:
            logger.exception("%s %r of %r raised", "callback" if success else "error_callback",
                             callback, self)
        finally:
            self._callback = self._error_callback = None
            self._ready.set()


class MapResult(AsyncResult[list[T]]):
    """What ``map_async`` and ``starmap_async`` return: ready once every chunk has ended.
    ``get()`` gives the results in input order, or raises the first exception to arrive,
    as the stdlib's does; ``callback`` gets the list, ``error_callback`` that exception."""

    def __init__(self, length: int, chunks: int,
                 callback: Callable[[Any], object] | None,
                 error_callback: Callable[[BaseException], object] | None) -> None:
        super().__init__(callback, error_callback)
        self._values: list[Any] = [None] * length
        self._error: BaseException | None = None
        self._left = chunks
        self._lock = InterruptSafeLock()  # callback threads only
        if chunks == 0:  # an empty input: ready at once, no callback (as the stdlib)
            self._success, self._value = True, self._values
            self._ready.set()

    def _chunk_done(self, start: int, size: int, future: Future[Any]) -> None:
        outcomes = chunk_outcomes(future, size)
        with self._lock:
            for index, (ok, value) in enumerate(outcomes, start):
                if ok:
                    self._values[index] = value
                elif self._error is None:
                    self._error = value
            self._left -= 1
            if self._left:
                return
        if self._error is None:
            self._set(True, self._values)
        else:
            self._set(False, self._error)


class IMapIterator(Generic[T]):
    """What ``imap`` (in input order) and ``imap_unordered`` (as they finish) return.
    ``next(timeout)`` raises ``multiprocessing.TimeoutError`` if no result comes in time.
    An item that failed raises its exception at its place; the next ``next()`` goes on
    with the item after it (the stdlib's chunked ``imap`` ends at the first failure)."""

    def __init__(self, ordered: bool) -> None:
        self._ordered = ordered
        # (start, outcomes) from the callback threads and the feeder; (-1, length) once
        # the feeder knows how many items there are.
        self._arrivals: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._waiting: dict[int, list[Outcome]] = {}   # ordered: arrived ahead of their turn
        self._ready: collections.deque[Outcome] = collections.deque()
        self._taken = 0            # items moved to _ready
        self._length: int | None = None
        self._lock = InterruptSafeLock()  # one next() at a time

    def __iter__(self) -> IMapIterator[T]:
        return self

    def next(self, timeout: float | None = None) -> T:
        """The next result (or the next item's exception, raised); ``StopIteration`` after
        the last; ``multiprocessing.TimeoutError`` if none comes within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._ready:
                if self._length is not None and self._taken >= self._length:
                    raise StopIteration
                self._take(self._next_arrival(deadline))
            ok, value = self._ready.popleft()
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    __next__ = next

    def _next_arrival(self, deadline: float | None) -> tuple[int, Any]:
        while True:
            left = SIGNAL_CHECK_SECONDS if deadline is None else min(
                SIGNAL_CHECK_SECONDS, deadline - time.monotonic())
            if left <= 0:
                raise multiprocessing.TimeoutError
            try:
                return self._arrivals.get(timeout=left)
            except queue.Empty:
                continue

    def _take(self, arrival: tuple[int, Any]) -> None:
        start, outcomes = arrival
        if start < 0:
            self._length = outcomes
            return
        if not self._ordered:
            self._ready.extend(outcomes)
            self._taken += len(outcomes)
            return
        self._waiting[start] = outcomes
        while self._taken in self._waiting:
            now = self._waiting.pop(self._taken)
            self._ready.extend(now)
            self._taken += len(now)

    # -- the feeder's and the callback threads' side --------------------------------------

    def _chunk_done(self, start: int, size: int, future: Future[Any]) -> None:
        self._arrivals.put((start, chunk_outcomes(future, size)))

    def _failed_at(self, start: int, error: BaseException) -> None:
        """The input could not go on from item ``start``: that item fails, the last."""
        self._arrivals.put((start, [(False, error)]))
        self._arrivals.put((-1, start + 1))

    def _ended(self, length: int) -> None:
        self._arrivals.put((-1, length))

"""``pool.Pool``: a drop-in for ``multiprocessing.pool.Pool`` on pool's dispatcher.

Owns: the face's own state (RUN, CLOSE, TERMINATE, as the stdlib names it), the feeder
threads of ``imap`` calls still reading their input, and the chunks not yet ended
(``_mp_chunks.ChunkRun``); everything else is the ``ProcessPool`` it holds (DESIGN.md,
"One engine, many faces").
Runs in: callers' threads; each ``imap`` reads its input on a feeder thread of its own,
as the stdlib's task thread does; results resolve on the pool's callback threads.
Guarantees:
- the stdlib's API and refusals: ``apply``, ``apply_async``, ``map``, ``map_async``,
  ``starmap``, ``starmap_async``, ``imap``, ``imap_unordered``, ``close``, ``join``,
  ``terminate``; ``with`` terminates on exit; a call on a pool that is not running raises
  ``ValueError("Pool not running")``, ``join()`` before ``close()`` ``ValueError("Pool is
  still running")``;
- a worker's death fails what it was running, and only that: an ``apply_async`` result, or
  the item it was running, in a chunk too (``_mp_chunks``); the rest run, none twice;
- an item's exception fails that item alone, chunked or not;
- ``close()`` lets every task submitted run, and the input of every ``imap`` still being
  read is read to its end first, and every chunk ended (the rest of one whose worker died
  runs as a new task); ``join()`` then returns once every worker is gone.
  ``terminate()`` cancels what has not started and ends the workers; the results it
  leaves unfinished fail (the stdlib's never become ready).
Assumes: the ``ProcessPool`` it holds is used by nothing else.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import queue
import threading
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sized, TypeVar

from ._errors import copy_error
from ._futures import PoolFuture
from ._latch import SIGNAL_CHECK_SECONDS, Latch
from ._locks import InterruptSafeLock
from ._mp_results import AsyncResult, IMapIterator, MapResult
from ._mp_chunks import ChunkRun, terminated
from ._worker.items import run_items

if TYPE_CHECKING:
    from ._executor import ProcessPool

T = TypeVar("T")

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"

# How many chunks an imap's feeder may have in the pool beyond four per worker: enough to
# keep the workers busy with tiny tasks, few enough that an endless input is read as the
# work goes.
FEED_GROUP = 64


class Pool:
    """A ``multiprocessing.pool.Pool`` in which a worker's death fails only what it was
    running, with :class:`pool.WorkerDied`, and the pool carries on.

    Takes ``multiprocessing.Pool``'s arguments: ``processes`` (default: the CPUs this
    process may use), ``initializer``, ``initargs``, ``maxtasksperchild`` and ``context``
    (default: ``multiprocessing``'s default context, as the stdlib's), and, keyword-only,
    :class:`pool.ProcessPool`'s own options: ``task_timeout``, ``max_memory_per_child``,
    ``idle_timeout``, ``stop_grace``, ``terminate_grace``, ``kill_grace``.

    ``apply_async`` and the ``_async`` maps return results with ``get(timeout)`` (raising
    ``multiprocessing.TimeoutError``), ``wait``, ``ready`` and ``successful``; their
    ``callback`` and ``error_callback`` run in this process, on a thread of the pool's, and
    one that raises is logged. ``imap`` and ``imap_unordered`` return iterators whose
    ``next(timeout)`` does the same; a failed item raises at its place and the iteration
    goes on. ``chunksize`` items travel and run as one task; an item that raises fails
    alone, and so does the one a death or a ``task_timeout`` hit (a chunk's time limit is
    ``task_timeout`` for each of its items): the items before it are delivered, the items
    after it run again, none twice.
    """

    def __init__(self, processes: int | None = None,
                 initializer: Callable[..., object] | None = None,
                 initargs: Iterable[Any] = (), maxtasksperchild: int | None = None,
                 context: Any = None, **options: Any) -> None:
        from ._executor import ProcessPool
        self._state = RUN  # before any check: __del__ reads it
        self._executor: ProcessPool | None = None
        if processes is not None and processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._ctx = context or multiprocessing.get_context()
        self._executor = ProcessPool(processes, mp_context=self._ctx, initializer=initializer,
                                     initargs=tuple(initargs),
                                     max_tasks_per_child=maxtasksperchild, **options)
        self._processes = self._executor._max_workers
        self._lock = InterruptSafeLock()  # the state and the feeders
        self._feeders: set[Latch] = set()  # one per imap still reading its input
        # Chunks of more than one item not yet ended: one may still need the rest of its
        # items run after a death (_mp_chunks), so the pool does not shut down under it.
        self._open_chunks: set[ChunkRun] = set()
        self._closed_down = Latch()        # close(): shutdown asked, once every feeder ended

    # -- the stdlib's attributes that code reads ------------------------------------------

    @property
    def _pool(self) -> list[Any]:
        """The live workers' ``Process`` objects (the stdlib's list of them)."""
        executor = self._executor
        return [] if executor is None else list(executor._processes.values())

    def __repr__(self) -> str:
        cls = type(self)
        name = "pool.Pool" if cls is Pool else f"{cls.__module__}.{cls.__qualname__}"
        return f"<{name} state={self._state} pool_size={self._processes}>"

    def __reduce__(self) -> Any:
        raise NotImplementedError("pool objects cannot be passed between processes or "
                                  "pickled")

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_state", None) == RUN and getattr(self, "_executor", None):
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning,
                  source=self)

    # -- calls -------------------------------------------------------------------------

    def apply(self, func: Callable[..., T], args: Iterable[Any] = (),
              kwds: dict[str, Any] | None = None) -> T:
        """``func(*args, **kwds)`` in a worker; its result, or its exception raised."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., T], args: Iterable[Any] = (),
                    kwds: dict[str, Any] | None = None,
                    callback: Callable[[T], object] | None = None,
                    error_callback: Callable[[BaseException], object] | None = None
                    ) -> AsyncResult[T]:
        """``func(*args, **kwds)`` in a worker, as an :class:`AsyncResult`."""
        executor = self._running()
        future = executor.schedule(func, tuple(args), {} if kwds is None else dict(kwds))
        return AsyncResult([future], callback, error_callback, self._run_later)

    def map(self, func: Callable[..., T], iterable: Iterable[Any],
            chunksize: int | None = None) -> list[T]:
        """``[func(item) for item in iterable]``, run in the pool, in input order. If any
        item failed, raises the first failure to arrive, once every item has ended."""
        return self._map_async(func, iterable, False, chunksize, None, None).get()

    def starmap(self, func: Callable[..., T], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[T]:
        """``map`` for argument tuples: ``func(*item)``."""
        return self._map_async(func, iterable, True, chunksize, None, None).get()

    def map_async(self, func: Callable[..., T], iterable: Iterable[Any],
                  chunksize: int | None = None,
                  callback: Callable[[list[T]], object] | None = None,
                  error_callback: Callable[[BaseException], object] | None = None
                  ) -> MapResult[T]:
        return self._map_async(func, iterable, False, chunksize, callback, error_callback)

    def starmap_async(self, func: Callable[..., T], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None,
                      callback: Callable[[list[T]], object] | None = None,
                      error_callback: Callable[[BaseException], object] | None = None
                      ) -> MapResult[T]:
        return self._map_async(func, iterable, True, chunksize, callback, error_callback)

    def imap(self, func: Callable[..., T], iterable: Iterable[Any],
             chunksize: int = 1) -> IMapIterator[T]:
        """``map``, lazily: an iterator of the results in input order. The input is read
        on a thread of its own as the work goes: at most ``4 * processes + 64`` chunks are
        in the pool at once, as the stdlib's pipe holds its reader back."""
        return self._imap(func, iterable, chunksize, ordered=True)

    def imap_unordered(self, func: Callable[..., T], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapIterator[T]:
        """``imap``, with the results in the order they finish."""
        return self._imap(func, iterable, chunksize, ordered=False)

    # -- life --------------------------------------------------------------------------

    def close(self) -> None:
        """Take no more calls; what was submitted runs. Then ``join()``."""
        with self._lock:
            if self._state != RUN:
                return
            self._state = CLOSE
            feeding = bool(self._feeders or self._open_chunks)
        if not feeding:
            self._shut_down()

    def terminate(self) -> None:
        """Stop now: cancel what has not started, end every worker (SIGTERM to its group,
        then SIGKILL), and wait until they are gone. Unfinished results fail."""
        with self._lock:
            self._state = TERMINATE
        try:
            if self._executor is not None:
                self._executor.terminate_workers()
        finally:  # even if a Ctrl-C cut the wait short: join() must not wait for ever
            self._closed_down.set()

    def join(self) -> None:
        """Wait, after ``close()`` or ``terminate()``, until every task has ended and every
        worker is gone."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        if self._state not in (CLOSE, TERMINATE):
            raise ValueError("In unknown state")
        with self._lock:
            # A close() that a Ctrl-C cut short may have left the shutdown unasked.
            unasked = self._state == CLOSE and not self._feeders and not self._open_chunks
        if unasked:
            self._shut_down()
        self._closed_down.wait()
        assert self._executor is not None
        self._executor.shutdown(wait=True)

    def __enter__(self) -> Pool:
        self._running()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()

    # -- how ---------------------------------------------------------------------------

    def _running(self) -> ProcessPool:
        if self._state != RUN or self._executor is None:
            raise ValueError("Pool not running")
        return self._executor

    def _run_later(self, fn: Callable[[], object]) -> None:
        """Runs ``fn`` on one of the pool's callback threads (results' callbacks)."""
        assert self._executor is not None
        self._executor._dispatcher.run_later(fn)

    def _shut_down(self) -> None:
        assert self._executor is not None
        self._executor.shutdown(wait=False)
        self._closed_down.set()

    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any], star: bool,
                   chunksize: int | None, callback: Callable[[Any], object] | None,
                   error_callback: Callable[[BaseException], object] | None
                   ) -> MapResult[Any]:
        executor = self._running()
        items = iterable if isinstance(iterable, Sized) else list(iterable)
        length = len(items)
        if chunksize is None:
            chunksize, extra = divmod(length, self._processes * 4)
            chunksize += bool(extra)
        elif chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        chunks = [] if length == 0 else list(_chunked(iter(items), chunksize))
        submit_group = executor._group_submitter(func, functools.partial(run_items, func, star),
                                                 functools.partial(_described, star),
                                                 _chunk_length)
        futures = self._submit_chunks(submit_group, chunks, star)
        # (An empty input is ready at once, with no callback called: as the stdlib's.)
        return MapResult(futures, [len(chunk) for chunk in chunks],
                         callback if chunks else None, error_callback if chunks else None,
                         self._run_later)

    def _imap(self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int,
              ordered: bool) -> IMapIterator[Any]:
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        result: IMapIterator[Any] = IMapIterator(ordered)
        done = Latch()
        with self._lock:  # a close() at the same time: either this feeder counts, or refused
            executor = self._running()
            self._feeders.add(done)
        try:
            submit_group = executor._group_submitter(
                func, functools.partial(run_items, func, False),
                functools.partial(_described, False), _chunk_length)
            feeder = threading.Thread(target=self._feed, name=f"{executor._dispatcher.name}-imap",
                                      args=(iterable, chunksize, submit_group, result, done),
                                      daemon=True)
            feeder.start()
        except BaseException:
            self._fed(done)
            raise
        return result

    def _feed(self, iterable: Iterable[Any], chunksize: int,
              submit_group: Callable[[list[tuple[Any, ...]]], list[PoolFuture[Any]]],
              result: IMapIterator[Any], done: Latch) -> None:
        """The feeder thread: reads the input and submits it, and says how long it was. At
        most ``_window()`` chunks are in the pool at once (the stdlib's task thread is held
        back by its pipe the same way), so an endless input is read as the work goes, not
        all at once. An input that raises fails the item it was reading, the last one; so
        does a pool that stops taking tasks."""
        start = 0
        in_pool = 0
        finished: queue.SimpleQueue[None] = queue.SimpleQueue()  # one per chunk that ended
        window = self._window()
        group_size = FEED_GROUP if isinstance(iterable, Sized) else 1
        try:
            chunks = _chunked(iter(iterable), chunksize)
            while True:
                # Until the pool has room for a whole group (a list's chunks are read and
                # submitted in groups: one command and one wake-up of the loop for each
                # group, not for each chunk), or for one chunk of an input read as it comes.
                while window - in_pool < group_size:
                    if self._state == TERMINATE:
                        result._failed_at(start, terminated())
                        return
                    try:
                        finished.get(timeout=SIGNAL_CHECK_SECONDS)
                        in_pool -= 1
                    except queue.Empty:
                        pass
                group: list[list[Any]] = []
                error: BaseException | None = None
                ended = False
                while len(group) < min(group_size, window - in_pool):
                    try:
                        chunk = next(chunks, None)
                    except BaseException as exc:  # the input's own error, as the stdlib's
                        error = exc
                        break
                    if chunk is None:
                        ended = True
                        break
                    group.append(chunk)
                if group:  # what was read before an error or the end runs too
                    try:
                        futures = self._submit_chunks(submit_group, group, False)
                    except BaseException as exc:  # terminated or broken under us
                        result._failed_at(start, terminated() if self._state == TERMINATE
                                          else copy_error(exc))
                        return
                    for chunk, future in zip(group, futures):
                        in_pool += 1
                        future._when_done(lambda _: finished.put(None))
                        result._submitted(start, len(chunk), future)
                        start += len(chunk)
                if error is not None:
                    result._failed_at(start, error)
                    return
                if ended:
                    result._ended(start)
                    return
        except BaseException as exc:  # never leave the iterator waiting for its end
            result._failed_at(start, exc)
        finally:
            self._fed(done)

    def _submit_chunks(self, submit_group: Callable[[list[tuple[Any, ...]]],
                                                    list[PoolFuture[Any]]],
                       chunks: list[list[Any]], star: bool) -> list[PoolFuture[Any]]:
        """Submits each chunk as one task. A chunk of more than one item is followed to its
        end by a ``ChunkRun``, whose future stands for it: a death in it costs one item.
        The pool does not shut down under a run until it has ended. A Ctrl-C anywhere in
        here leaves no run the pool would wait for: each is registered before its task
        exists, and one not yet following its task is let go (a set: twice is harmless)."""
        arguments_of = functools.partial(_item_arguments, star)
        runs = [ChunkRun(chunk, submit_group, self._run_later, self._may_resubmit,
                         self._chunk_released, arguments_of) if len(chunk) > 1 else None
                for chunk in chunks]
        several = [run for run in runs if run is not None]
        try:
            if several:
                with self._lock:
                    self._open_chunks.update(several)
            tasks = submit_group([(chunk,) for chunk in chunks])
            futures = []
            for run, task in zip(runs, tasks):
                if run is None:
                    futures.append(task)
                else:
                    run.follow(task)
                    futures.append(run.future)
            return futures
        except BaseException:
            self._let_go([run for run in several if not run.following])
            raise

    def _may_resubmit(self) -> bool:
        return self._state != TERMINATE

    def _chunk_released(self, run: ChunkRun) -> None:
        """A ``ChunkRun`` ended, on any thread, the dispatcher's included: the set is
        changed here (the lock is only ever held for a moment); a shutdown it allows is
        asked from a callback thread, never from the dispatcher's."""
        with self._lock:
            self._open_chunks.discard(run)
            last = (not self._open_chunks and not self._feeders and self._state == CLOSE)
        if last:
            self._run_later(self._shut_down)

    def _let_go(self, runs: list[ChunkRun]) -> None:
        """The pool no longer waits for these runs; if it is closed and they were the last
        thing it waited for, it shuts down."""
        if not runs:
            return
        with self._lock:
            self._open_chunks.difference_update(runs)
            last = (not self._open_chunks and not self._feeders and self._state == CLOSE)
        if last:
            self._shut_down()

    def _window(self) -> int:
        return 4 * self._processes + FEED_GROUP

    def _fed(self, done: Latch) -> None:
        """An imap has read all of its input: if the pool is closed and it was the last, the
        pool may now shut down."""
        with self._lock:
            self._feeders.discard(done)
            last = not self._feeders and not self._open_chunks and self._state == CLOSE
        done.set()
        if last:
            self._shut_down()


def _chunked(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def _chunk_length(args: tuple[Any, ...]) -> int:
    """The items a chunk's call runs: its time limit is ``task_timeout`` for each."""
    (chunk,) = args
    return len(chunk)


def _item_arguments(star: bool, item: Any) -> tuple[Any, ...]:
    """The arguments of one item's call, as errors show them."""
    return tuple(item) if star else (item,)


def _described(star: bool, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What errors show as the arguments of a chunk's call: the item's own, for a chunk of
    one (``work(3)``, not ``work([3])``); the list of items, for a longer one."""
    (chunk,) = args
    if len(chunk) != 1:
        return args
    return _item_arguments(star, chunk[0])

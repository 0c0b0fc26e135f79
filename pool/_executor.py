"""The public executor: ``ProcessPool``, a drop-in for ``ProcessPoolExecutor``.

Owns: argument checking, pickling of calls (in the caller's thread, so a call that cannot
be pickled raises right there), ``map``'s ordering and chunking, and the pool's lifetime.
Runs in: the callers' threads; all process work is done by the ``Dispatcher`` it owns.
Guarantees: the stdlib's semantics for ``submit``, ``map``, ``shutdown`` and the context
manager, except where README.rst lists a deliberate difference.
"""

from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import os
import time
import weakref
from concurrent.futures import Executor, Future
from typing import Any, Callable, Iterable, Iterator

from . import _wire
from ._dispatcher import Dispatcher
from ._errors import TaskInfo


def default_context() -> Any:
    """forkserver where the platform has it (the 3.14 default on Linux), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _process_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> list[Any]:
    """Runs in the worker: one ``map`` chunk, as a single task."""
    return [fn(*args) for args in chunk]


class ProcessPool(Executor):
    """A process pool in which a worker's death fails one task instead of the whole pool.

    Takes ``ProcessPoolExecutor``'s arguments:

    ``max_workers``
        how many worker processes at most (default: the CPUs this process may use).
    ``mp_context``
        a ``multiprocessing`` context; default forkserver on Linux, spawn elsewhere. Every
        start method works, ``fork`` included, with every option below.
    ``initializer``, ``initargs``
        called in each worker before its first task. If it raises (or the worker dies
        while starting) several times in a row, the pool stops starting workers and the
        waiting tasks fail with :class:`pool.InitializerError`.
    ``max_tasks_per_child``
        replace a worker after it ran this many tasks.

    A worker that dies fails only the task it was running, with :class:`pool.WorkerDied`
    naming the pid, exit code or signal, the task and the crash site; it is replaced and
    the pool carries on. Functions, arguments and results are pickled with ``pickle``, or
    ``cloudpickle`` for what ``pickle`` cannot do by reference (lambdas, closures,
    functions of ``__main__``).
    """

    def __init__(self, max_workers: int | None = None, mp_context: Any = None,
                 initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = (),
                 *, max_tasks_per_child: int | None = None) -> None:
        if max_workers is None:
            max_workers = _cpu_count()
        elif not isinstance(max_workers, int) or isinstance(max_workers, bool):
            raise TypeError("max_workers must be an integer")
        elif max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int) or isinstance(max_tasks_per_child, bool):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
        if mp_context is None:
            mp_context = default_context()
        encoded_initializer = None
        if initializer is not None:
            # Pickled here, so that a bad initializer fails in the constructor, not in a
            # worker, and a lambda or __main__ function works under spawn too.
            encoded_initializer = _wire.encode_call(
                _wire.dumps_callable(initializer),
                _wire.dumps_arguments(initializer, tuple(initargs), {}))
        self._max_workers = max_workers
        self._mp_context = mp_context
        self._dispatcher = Dispatcher(max_workers=max_workers, mp_context=mp_context,
                                      initializer=encoded_initializer,
                                      max_tasks_per_child=max_tasks_per_child)
        # A pool dropped without shutdown() still finishes its work and releases its
        # processes; the dispatcher holds no reference back to this object.
        self._finalizer = weakref.finalize(self, self._dispatcher.shutdown, False, False)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Schedule ``fn(*args, **kwargs)``; returns a ``concurrent.futures.Future``.

        Raises :class:`pool.ArgumentPicklingError` here, in the caller's thread, if the call
        cannot be pickled; ``RuntimeError`` after shutdown; the pool's error if it broke.
        """
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")
        self._dispatcher.check_open()
        body = _wire.encode_call(_wire.dumps_callable(fn),
                                 _wire.dumps_arguments(fn, args, kwargs))
        return self._dispatcher.submit(
            lambda task_id: TaskInfo(task_id, fn, args, kwargs), body)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1, buffersize: int | None = None) -> Iterator[Any]:
        """Like ``map(fn, *iterables)``, run in the pool; results come in input order.

        ``chunksize`` items travel and run as one task (the function is pickled once per
        call of ``map``, not per item). With ``buffersize``, the input is read lazily: at most
        that many chunks are submitted ahead of the result being yielded, as in 3.14.
        If a chunk fails, its first result raises; leaving the iterator early cancels what
        has not started.
        """
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None and not isinstance(buffersize, int):
            raise TypeError("buffersize must be an integer or None")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0")
        end_time = None if timeout is None else timeout + time.monotonic()
        self._dispatcher.check_open()
        runner: Callable[..., Any] = fn
        if chunksize > 1:
            runner = functools.partial(_process_chunk, fn)
        fn_blob = _wire.dumps_callable(runner)
        batches: Iterator[tuple[Any, ...]] = zip(*iterables)
        if chunksize > 1:
            batches = ((list(chunk),) for chunk in _batched(batches, chunksize))

        def submit_batch(args: tuple[Any, ...]) -> Future[Any]:
            body = _wire.encode_call(fn_blob, _wire.dumps_arguments(fn, args, {}))
            return self._dispatcher.submit(lambda task_id: TaskInfo(task_id, fn, args, {}), body)

        futures: collections.deque[Future[Any]] = collections.deque()
        try:
            for args in itertools.islice(batches, buffersize):
                futures.append(submit_batch(args))
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        results = _ordered_results(futures, batches if buffersize else iter(()),
                                   submit_batch, end_time)
        if chunksize > 1:
            return itertools.chain.from_iterable(results)
        return results

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; finish the ones submitted, then end every worker.

        ``cancel_futures=True`` cancels the tasks that have not started. With ``wait``,
        returns once every worker has exited and been reaped.
        """
        self._dispatcher.shutdown(wait, cancel_futures)


ProcessPoolExecutor = ProcessPool


def _ordered_results(futures: collections.deque[Future[Any]], more: Iterator[tuple[Any, ...]],
                     submit_batch: Callable[[tuple[Any, ...]], Future[Any]],
                     end_time: float | None) -> Iterator[Any]:
    try:
        while futures:
            args = next(more, None)
            if args is not None:
                futures.append(submit_batch(args))
            future = futures.popleft()
            timeout = None if end_time is None else end_time - time.monotonic()
            yield _result_or_cancel(future, timeout)
            del future
    finally:
        for future in futures:
            future.cancel()


def _result_or_cancel(future: Future[Any], timeout: float | None) -> Any:
    try:
        try:
            return future.result(timeout)
        finally:
            future.cancel()
    finally:
        del future  # break the reference cycle with the exception's traceback


def _batched(items: Iterator[tuple[Any, ...]], size: int) -> Iterator[tuple[tuple[Any, ...], ...]]:
    while chunk := tuple(itertools.islice(items, size)):
        yield chunk


def _cpu_count() -> int:
    count = getattr(os, "process_cpu_count", None)  # 3.13+: honours the affinity mask
    if count is not None:
        return count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


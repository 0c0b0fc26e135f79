"""The public executor: ``ProcessPool``, a drop-in for ``ProcessPoolExecutor``.

Owns: pickling of calls, in the caller's thread, so that a call that cannot be pickled
fails its future at once and sends nothing; and the pool's lifetime. The constructor's
arguments are checked by ``_options``; what the first task needs done first is
``_first_task``'s; ``map``'s chunking and ordering are ``_mapping``'s.
Runs in: the callers' threads; all process work is done by the ``Dispatcher`` it owns.
Guarantees: the stdlib's semantics for ``submit``, ``map``, ``shutdown`` and the context
manager, except where docs/differences.rst lists a deliberate difference.
"""

from __future__ import annotations

import signal
import sys
import weakref
from concurrent.futures import Executor
from types import TracebackType
from typing import (TYPE_CHECKING, Any, AsyncGenerator, Callable, Iterable, Iterator,
                    ParamSpec, TypeVar)

from ._wire import pickling as _pickling
from ._first_task import before_first_task
from ._futures import PoolFuture, failed_future
from ._options import POOL_DEFAULT, checked_options, seconds
from ._stdlib_attributes import StdlibAttributes

# What only a pool's owner uses (the dispatcher and its state machine, map, asyncio, stats)
# is imported where a pool is built or used, not here. Under spawn and forkserver every
# worker imports the user's main script again, as __mp_main__, and so this module, for its
# ``from pool import ProcessPool``; CPython's forkserver does not keep the script
# preloaded. A worker that also imported those paid ~25 ms more at every start.
if TYPE_CHECKING:
    from . import _mapping
    from ._progress import ProgressTarget
    from ._stats import PoolStats


T = TypeVar("T")
P = ParamSpec("P")


class ProcessPool(StdlibAttributes, Executor):
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

    And, keyword-only, what the stdlib lacks:

    ``task_timeout``
        seconds a task may run, counted from when it starts (``None``: no limit; per call,
        see :meth:`schedule`). A task that overruns fails with :class:`pool.TaskTimeout`
        holding the stack it was stuck in; its worker is killed and replaced.
    ``max_memory_per_child``
        bytes of resident memory: a worker above it after a task is replaced.
    ``idle_timeout``
        seconds a worker may sit idle before it exits (``None``: workers stay until
        shutdown). New work starts workers again, as at first.
    ``stop_grace``, ``terminate_grace``, ``kill_grace``
        how ending a worker escalates, in seconds: an idle worker asked to stop gets
        ``stop_grace`` (3) to exit before SIGTERM; after SIGTERM it gets ``terminate_grace``
        (0.5) before SIGKILL; after SIGKILL, ``kill_grace`` (5) before it is reported by pid
        as not confirmed gone. Each signal goes to the worker's whole process group.

    A worker that dies fails only the task it was running, with :class:`pool.WorkerDied`
    naming the pid, exit code or signal, the task and the crash site; it is replaced and
    the pool carries on. A ``KeyboardInterrupt`` (or asyncio's ``CancelledError``) that
    leaves a ``with`` block cancels the queued tasks and terminates the running ones instead
    of waiting for them. Functions, arguments and results are pickled with ``pickle``, or
    ``cloudpickle`` for what ``pickle`` cannot do by reference (lambdas, closures,
    functions of ``__main__``).
    """

    def __init__(self, max_workers: int | None = None, mp_context: Any = None,
                 initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = (),
                 *, max_tasks_per_child: int | None = None, task_timeout: float | None = None,
                 max_memory_per_child: int | None = None, idle_timeout: float | None = None,
                 stop_grace: float = 3.0, terminate_grace: float = 0.5,
                 kill_grace: float = 5.0) -> None:
        options = checked_options(max_workers, mp_context, initializer, initargs,
                                  max_tasks_per_child=max_tasks_per_child,
                                  task_timeout=task_timeout,
                                  max_memory_per_child=max_memory_per_child,
                                  idle_timeout=idle_timeout, stop_grace=stop_grace,
                                  terminate_grace=terminate_grace, kill_grace=kill_grace)
        from ._dispatcher.front import Dispatcher
        self._task_timeout = options.task_timeout
        # These two as the stdlib names them; the others that code reads: StdlibAttributes.
        self._max_workers = options.max_workers
        self._mp_context = options.mp_context
        self._dispatcher = Dispatcher(max_workers=options.max_workers,
                                      mp_context=options.mp_context,
                                      initializer=options.initializer,
                                      max_tasks_per_child=options.max_tasks_per_child,
                                      max_memory_per_child=options.max_memory_per_child,
                                      timeouts=options.timeouts,
                                      idle_timeout=options.idle_timeout)
        self._main_checked = False  # see _check_first_use
        # A pool dropped without shutdown() still finishes its work and releases its
        # processes; the dispatcher holds no reference back to this object.
        self._finalizer = weakref.finalize(self, self._dispatcher.shutdown, False, False)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
               ) -> PoolFuture[T]:
        """Schedule ``fn(*args, **kwargs)``; returns a ``concurrent.futures.Future``.

        If the call cannot be pickled, the future it returns has already failed with
        :class:`pool.ArgumentPicklingError` (a ``pickle.PicklingError``) and nothing is sent.
        Raises ``RuntimeError`` after shutdown, and the pool's error if it broke.
        """
        return self._submit(fn, args, kwargs, self._task_timeout)

    def schedule(self, fn: Callable[..., T], /, args: Iterable[Any] = (),
                 kwargs: dict[str, Any] | None = None, *,
                 timeout: float | None = POOL_DEFAULT) -> PoolFuture[T]:
        """``submit`` with options: run ``fn(*args, **kwargs)``, and stop it if it runs
        longer than ``timeout`` seconds (default: the pool's ``task_timeout``; ``None``: no
        limit). The clock starts when the task starts running; on expiry its future fails
        with :class:`pool.TaskTimeout`, which holds the task's stack at that moment.
        """
        if timeout is POOL_DEFAULT:
            timeout = self._task_timeout
        else:
            timeout = seconds("timeout", timeout, optional=True)
        return self._submit(fn, tuple(args), {} if kwargs is None else dict(kwargs), timeout)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                timeout: float | None) -> PoolFuture[Any]:
        """``args`` and ``kwargs`` are the pool's own from here on (copied, if need be)."""
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")
        self._dispatcher.check_open()
        if not self._main_checked:
            self._check_first_use()
        try:
            body = _pickling.encode_call(_pickling.dumps_callable(fn),
                                         _pickling.dumps_arguments(fn, args, kwargs))
        except Exception as exc:
            # (The pool's errors, and the stdlib's process pool they extend, are imported
            # once the pool's machinery is, after the forkserver's early start.)
            from ._errors import ArgumentPicklingError
            if isinstance(exc, ArgumentPicklingError):
                return failed_future(exc)
            raise
        return self._dispatcher.submit(fn, args, kwargs, body, timeout)

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1, buffersize: int | None = None,
            progress: ProgressTarget | None = None) -> Iterator[T]:
        """Like ``map(fn, *iterables)``, run in the pool; results come in input order.

        ``chunksize`` items travel and run as one task (the function is pickled once per
        call of ``map``, not per item). With ``buffersize``, the input is read lazily: at most
        that many chunks are submitted ahead of the result being yielded, as in 3.14.
        If a chunk fails, its first result raises; leaving the iterator early cancels what
        has not started. The pool's ``task_timeout`` applies to each chunk.

        ``progress``: an object with ``update(n)`` (a ``tqdm`` bar) or a callable taking
        ``n``, told how many items are done as their tasks finish (failed ones included),
        on a thread of its own; see docs/guide/using.rst, "Progress".
        """
        return self._map(fn, iterables, timeout, chunksize, buffersize, progress)

    def _map(self, fn: Callable[..., T], iterables: tuple[Iterable[Any], ...],
             timeout: float | None, chunksize: int, buffersize: int | None,
             progress: ProgressTarget | None,
             through: Callable[[Callable[[], PoolFuture[Any]]], PoolFuture[Any]] | None = None
             ) -> Iterator[T]:
        """``map``. ``through``, if given, makes each of its submissions: a
        ``_shared.Lease`` counts its own futures."""
        from . import _mapping
        from ._progress import Progress
        reporter = None if progress is None else Progress(progress)
        batches, submit_group = self._map_calls(fn, iterables, chunksize, buffersize)
        return _mapping.results(batches, submit_group, chunksize=chunksize, buffersize=buffersize,
                                timeout=timeout, progress=reporter, through=through,
                                grouped=_mapping.groupable(iterables))

    async def run(self, fn: Callable[..., T], /, *args: Any, timeout: float | None = POOL_DEFAULT,
                  **kwargs: Any) -> T:
        """``await pool.run(fn, *args, **kwargs)``: run it in the pool and return its result
        (or raise its exception), without blocking the event loop.

        ``timeout`` is the task's time limit, as with :meth:`schedule` (default: the pool's
        ``task_timeout``; ``None``: no limit): on expiry, :class:`pool.TaskTimeout`.
        Cancelling the await (``task.cancel()``, ``asyncio.timeout``) cancels the task if it
        is queued and stops it if it runs: its worker and the worker's process group are
        killed, and a new worker takes the slot.
        """
        # Awaits PoolFuture.__await__. (No comment on the next line: a task's traceback
        # shows it.)
        return await self.schedule(fn, args, kwargs, timeout=timeout)

    def amap(self, fn: Callable[..., T], *iterables: Iterable[Any], buffersize: int | None = None,
             ordered: bool = True, chunksize: int = 1) -> AsyncGenerator[T, None]:
        """``map`` for ``async for``: ``async for result in pool.amap(fn, items): ...``.

        Results come in input order, or as they finish with ``ordered=False``; a task's
        failure is raised at its place in the results. ``chunksize`` items travel and run as
        one task, as with :meth:`map`. Nothing is submitted before the first result is
        asked for; with ``buffersize``, the input is read lazily, at most that many tasks
        ahead of the results taken. Leaving the loop early (``break``, an exception,
        ``aclose()``, cancellation, a failed task) cancels the queued tasks and stops the
        running ones (their workers are killed). The pool's ``task_timeout`` applies to each
        task. Options and the pool's state are checked here, at the call.
        """
        from . import _aio
        return _aio.amap(self, fn, iterables, buffersize=buffersize, ordered=ordered,
                         chunksize=chunksize)

    def _map_calls(self, fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...],
                   chunksize: int, buffersize: int | None
                   ) -> tuple[Iterator[tuple[Any, ...]], _mapping.SubmitGroup]:
        """What ``map`` and ``amap`` submit, once their options are checked and the pool is
        known to be open. That is the input as argument tuples, read lazily, and the
        function that submits a group of them with the pool's ``task_timeout``
        (``_mapping.calls``)."""
        from . import _mapping
        _mapping.check_options(chunksize, buffersize)
        self._dispatcher.check_open()
        if not self._main_checked:
            self._check_first_use()
        if "submit" in vars(self) or type(self).submit is not ProcessPool.submit:
            # Overridden or wrapped: every task goes through it, as with the stdlib.
            return _mapping.calls_through_submit(fn, iterables, chunksize, self.submit)
        return _mapping.calls(fn, iterables, chunksize, lambda encoded: (
            self._dispatcher.submit_many(encoded, self._task_timeout)))

    def _group_submitter(self, fn: Callable[..., Any], runner: Callable[..., Any],
                         described: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None,
                         items_of: Callable[[tuple[Any, ...]], int] | None = None
                         ) -> _mapping.SubmitGroup:
        """What other faces submit through (``pool.Pool``'s chunks): a function that
        submits groups of argument tuples for ``runner``, which calls ``fn``, with the
        pool's ``task_timeout`` (times ``items_of(args)``, the items a call runs, if
        given); ``runner`` is pickled once. ``described``: see
        ``_mapping.encoded_submitter``. Raises what ``submit`` would if the pool is not
        open."""
        from . import _mapping
        self._dispatcher.check_open()
        if not self._main_checked:
            self._check_first_use()
        timeout = self._task_timeout
        return _mapping.encoded_submitter(
            fn, runner, lambda encoded: self._dispatcher.submit_many(encoded, timeout),
            described, items_of, lambda encoded, items: self._dispatcher.submit_many(
                encoded, None if timeout is None else timeout * items))

    def _check_first_use(self) -> None:
        """Before the first task: fail at once where workers cannot work, and prepare
        for their start (see ``_first_task``)."""
        before_first_task(self._mp_context)
        self._main_checked = True

    def stats(self) -> PoolStats:
        """A snapshot of what the pool has done and is doing: tasks queued, running,
        completed, failed, cancelled, stopped and timed out; workers started and deaths by
        cause; and per live worker its pid, tasks run, current task and resident memory.
        See :class:`pool.PoolStats`.

        Exact: taken on the pool's thread once it has acted on everything this thread did
        before. A task just submitted is counted; one just cancelled is not queued. Cheap:
        no worker is asked anything, and memory is read from ``/proc``.
        """
        from ._stats import with_memory
        self._dispatcher.snapshot()
        return with_memory(self._dispatcher.stats)

    def __repr__(self) -> str:
        dispatcher = self._dispatcher
        if dispatcher.broken_error is not None:
            state = "broken"
        elif dispatcher.ended:
            state = "shut down"
        elif dispatcher.closing:
            state = "shutting down"
        else:
            state = "running"
        processes, (queued, sent) = dispatcher.snapshot()
        cls = type(self)
        name = "pool.ProcessPool" if cls is ProcessPool else f"{cls.__module__}.{cls.__qualname__}"
        return (f"<{name} {state}: "
                f"{len(processes)} of {self._max_workers} workers "
                f"({self._mp_context.get_start_method()}), {queued} queued, "
                f"{sent} sent to workers>")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; finish the ones submitted, then end every worker.

        ``cancel_futures=True`` cancels the tasks that have not started. With ``wait``,
        returns once every worker has exited and been reaped. If a ``KeyboardInterrupt``
        interrupts that wait, the pool stops waiting for its tasks: it terminates the
        workers (see :meth:`terminate_workers`), then lets the interrupt go on.
        """
        self._dispatcher.shutdown(wait, cancel_futures)

    def terminate_workers(self, *, wait: bool = True) -> None:
        """Shut down now: cancel the tasks that have not started and end every worker with
        SIGTERM (and its process group), then SIGKILL those still there after
        ``terminate_grace``. Tasks that were running fail with
        :class:`pool.WorkerTerminated`. With ``wait``, returns once every worker is reaped
        or reported by pid; the 3.14 stdlib does not wait."""
        self._dispatcher.terminate(signal.SIGTERM, wait)

    def kill_workers(self, *, wait: bool = True) -> None:
        """Like :meth:`terminate_workers`, with SIGKILL at once."""
        self._dispatcher.terminate(signal.SIGKILL, wait)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if _means_stop(exc_type):
            self.terminate_workers()  # do not make the user wait for what they interrupted
        else:
            self.shutdown(wait=True)

    async def __aenter__(self) -> ProcessPool:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """``async with``: as ``with``, but waits for the tasks without blocking the event
        loop. If that wait is cancelled or interrupted, the workers are terminated."""
        import asyncio
        if _means_stop(exc_type):
            self.terminate_workers()
            return
        self._dispatcher.shutdown(wait=False, cancel_futures=False)
        try:
            # Done-callbacks are not awaited. (Not on the next line: a cancelled or
            # interrupted wait's traceback shows it.)
            await asyncio.wrap_future(self._dispatcher.finished)
        except BaseException:
            self.terminate_workers()
            raise


ProcessPoolExecutor = ProcessPool


def _means_stop(exc_type: type[BaseException] | None) -> bool:
    """Leaving a ``with`` block by Ctrl-C or by asyncio cancellation asks to stop, not to
    wait for the running tasks. ``asyncio`` is looked up, not imported: if it was never
    imported, the exception cannot be its ``CancelledError``."""
    if exc_type is None:
        return False
    if issubclass(exc_type, KeyboardInterrupt):
        return True
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and issubclass(exc_type, asyncio.CancelledError)


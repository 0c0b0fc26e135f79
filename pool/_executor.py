"""The public executor: ``ProcessPool``, a drop-in for ``ProcessPoolExecutor``.

Owns: argument checking, pickling of calls (in the caller's thread, so a call that cannot
be pickled fails its future at once, sending nothing), ``map``'s ordering and chunking, and
the pool's lifetime.
Runs in: the callers' threads; all process work is done by the ``Dispatcher`` it owns.
Guarantees: the stdlib's semantics for ``submit``, ``map``, ``shutdown`` and the context
manager, except where README.rst lists a deliberate difference.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import threading
import weakref
from concurrent.futures import Executor
from types import TracebackType
from typing import (TYPE_CHECKING, Any, AsyncGenerator, Callable, Iterable, Iterator,
                    ParamSpec, TypeVar)

from ._wire import pickling as _pickling
from ._errors import ArgumentPicklingError
from ._worker.forkserver import preload_in_forkserver
from ._worker.main_guard import (check_main_is_guarded, check_not_daemonic,
                                 remember_main_script)
from ._futures import PoolFuture, failed

# A worker's own modules, and those it imports when a task first needs them (a function
# sent by value, an exception, an error of the pool's): a forkserver imports them once,
# before it forks any worker, instead of every worker after its fork.
_WORKER_MODULES = ("pool._worker.main", "pool._errors", "cloudpickle", "tblib.pickling_support")

# What only a pool's owner uses (the dispatcher and its state machine, map, asyncio, stats)
# is imported where a pool is built or used, not here: every worker under spawn and
# forkserver imports the user's main script again (as __mp_main__; CPython's forkserver
# does not keep it preloaded), and so this module, for its ``from pool import
# ProcessPool``; a worker that also imported those paid ~25 ms more at every start.
if TYPE_CHECKING:
    from . import _mapping
    from ._progress import ProgressTarget
    from ._stats import PoolStats


T = TypeVar("T")
P = ParamSpec("P")


class _Default:
    def __repr__(self) -> str:
        return "<the pool's task_timeout>"


_POOL_DEFAULT: Any = _Default()


def default_context() -> Any:
    """forkserver where the platform has it (the 3.14 default on Linux), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


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
        if max_memory_per_child is not None:
            if (not isinstance(max_memory_per_child, int)
                    or isinstance(max_memory_per_child, bool)):
                raise TypeError("max_memory_per_child must be an integer (bytes)")
            if max_memory_per_child <= 0:
                raise ValueError("max_memory_per_child must be > 0")
        self._task_timeout = _seconds("task_timeout", task_timeout, optional=True)
        idle_timeout = _seconds("idle_timeout", idle_timeout, optional=True)
        from ._dispatcher.front import Dispatcher
        from ._core.states import Timeouts
        from ._worker.main import Initializer, prepare_initargs
        timeouts = Timeouts(stop=_seconds("stop_grace", stop_grace),
                            terminate=_seconds("terminate_grace", terminate_grace),
                            kill=_seconds("kill_grace", kill_grace))
        check_not_daemonic()
        if mp_context is None:
            mp_context = default_context()
        initializer_setup = None
        if initializer is not None:
            # Checked here, so that a bad initializer or initargs fail in the constructor,
            # not in every worker; see Initializer for how they travel.
            initializer_setup = Initializer(_pickling.dumps_callable(initializer),
                                           prepare_initargs(tuple(initargs), mp_context))
        self._max_workers = max_workers
        self._mp_context = mp_context
        self._dispatcher = Dispatcher(max_workers=max_workers, mp_context=mp_context,
                                      initializer=initializer_setup,
                                      max_tasks_per_child=max_tasks_per_child,
                                      max_memory_per_child=max_memory_per_child,
                                      timeouts=timeouts, idle_timeout=idle_timeout)
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
                 timeout: float | None = _POOL_DEFAULT) -> PoolFuture[T]:
        """``submit`` with options: run ``fn(*args, **kwargs)``, and stop it if it runs
        longer than ``timeout`` seconds (default: the pool's ``task_timeout``; ``None``: no
        limit). The clock starts when the task starts running; on expiry its future fails
        with :class:`pool.TaskTimeout`, which holds the task's stack at that moment.
        """
        if timeout is _POOL_DEFAULT:
            timeout = self._task_timeout
        else:
            timeout = _seconds("timeout", timeout, optional=True)
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
        except ArgumentPicklingError as exc:
            return failed(exc)
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
        on a thread of its own; see README.rst, "Progress".
        """
        return self._map(fn, iterables, timeout, chunksize, buffersize, progress)

    def _map(self, fn: Callable[..., T], iterables: tuple[Iterable[Any], ...],
             timeout: float | None, chunksize: int, buffersize: int | None,
             progress: ProgressTarget | None,
             through: Callable[[Callable[[], PoolFuture[Any]]], PoolFuture[Any]] | None = None
             ) -> Iterator[T]:
        """``map``; ``through``, if given, makes each of its submissions (a lease counts
        its own futures: ``_shared.Lease``)."""
        from . import _mapping
        from ._progress import Progress
        reporter = None if progress is None else Progress(progress)
        batches, submit_group = self._map_calls(fn, iterables, chunksize, buffersize)
        return _mapping.results(batches, submit_group, chunksize=chunksize, buffersize=buffersize,
                                timeout=timeout, progress=reporter, through=through,
                                grouped=_mapping.groupable(iterables))

    async def run(self, fn: Callable[..., T], /, *args: Any, timeout: float | None = _POOL_DEFAULT,
                  **kwargs: Any) -> T:
        """``await pool.run(fn, *args, **kwargs)``: run it in the pool and return its result
        (or raise its exception), without blocking the event loop.

        ``timeout`` is the task's time limit, as with :meth:`schedule` (default: the pool's
        ``task_timeout``; ``None``: no limit): on expiry, :class:`pool.TaskTimeout`.
        Cancelling the await (``task.cancel()``, ``asyncio.timeout``) cancels the task if it
        is queued and stops it if it runs: its worker and the worker's process group are
        killed, and a new worker takes the slot.
        """
        from . import _aio
        return await _aio.run(self, fn, args, kwargs, timeout)

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
        known to be open: the input as argument tuples, read lazily, and the function that
        submits a group of them with the pool's ``task_timeout`` (``_mapping.calls``)."""
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

    def _check_first_use(self) -> None:
        """Before the first task: fail at once, with the fix, where workers would re-run
        the caller's own code (a main script without its ``__main__`` guard)."""
        method = self._mp_context.get_start_method()
        check_main_is_guarded(method)
        remember_main_script()
        if method == "forkserver":  # so that a worker starts at the cost of a fork
            preload_in_forkserver(self._mp_context, *_WORKER_MODULES)
        elif method == "fork":
            # What a worker imports when a task first needs it, imported here, before any
            # fork: a fork while another thread of this process imports a module leaves
            # the child that module's import lock, held by a thread it does not have.
            for name in _WORKER_MODULES:
                importlib.import_module(name)
        # What the program printed before its first task comes out before what workers
        # print (the stdlib flushes before each start; the pool's thread does not: a full
        # stdout pipe would hold up the whole pool). Here, in the caller's thread, once.
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        self._main_checked = True

    def stats(self) -> PoolStats:
        """A snapshot of what the pool has done and is doing: tasks queued, running,
        completed, failed, cancelled, stopped and timed out; workers started and deaths by
        cause; and per live worker its pid, tasks run, current task and resident memory.
        See :class:`pool.PoolStats`.

        Exact: taken on the pool's thread once it has acted on everything this thread did
        before (a task just submitted is counted; one just cancelled is not queued), and
        cheap: no worker is asked anything (memory is read from ``/proc``).
        """
        from ._stats import with_memory
        self._dispatcher.snapshot()
        return with_memory(self._dispatcher.stats)

    @property
    def _processes(self) -> dict[int, Any]:
        """The live workers, ``{pid: multiprocessing Process}``, as in the stdlib (where code
        reads it to find or signal workers): a snapshot taken once the pool's thread has
        acted on every task submitted before, so the workers started for them are listed
        (workers start on demand, on that thread)."""
        return self._dispatcher.live_processes()

    @property
    def _broken(self) -> str | bool:
        """False, or why the pool is broken (its dispatcher failed, or workers kept failing
        to start), as the stdlib's attribute of that name: code polls it."""
        error = self._dispatcher.broken_error
        return False if error is None else str(error)

    @property
    def _executor_manager_thread(self) -> threading.Thread | None:
        """The pool's dispatcher thread (the stdlib's name for its manager thread); None
        before the first ``submit()``. It ends once the pool is shut down and every worker
        is gone."""
        return self._dispatcher.thread

    def __repr__(self) -> str:
        dispatcher = self._dispatcher
        if dispatcher.broken_error is not None:
            state = "broken"
        elif dispatcher.finished.done():
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
        :class:`pool.WorkerTerminated`. With ``wait`` (unlike the 3.14 stdlib, which does
        not wait), returns once every worker is reaped or reported by pid."""
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
        loop; if that wait is cancelled (or interrupted), the workers are terminated."""
        import asyncio
        if _means_stop(exc_type):
            self.terminate_workers()
            return
        self._dispatcher.shutdown(wait=False, cancel_futures=False)
        try:
            await asyncio.wrap_future(self._dispatcher.finished)  # (done-callbacks not awaited)
        except BaseException:
            self.terminate_workers()
            raise


ProcessPoolExecutor = ProcessPool


def _means_stop(exc_type: type[BaseException] | None) -> bool:
    """Leaving a ``with`` block by Ctrl-C or by asyncio cancellation asks to stop, not to
    wait for the running tasks. (``asyncio`` is looked up, not imported: if it was never
    imported, the exception cannot be its ``CancelledError``.)"""
    if exc_type is None:
        return False
    if issubclass(exc_type, KeyboardInterrupt):
        return True
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and issubclass(exc_type, asyncio.CancelledError)


def _seconds(name: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number of seconds{' or None' if optional else ''}")
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be > 0 and finite, not {value!r}")
    return float(value)


def _cpu_count() -> int:
    count = getattr(os, "process_cpu_count", None)  # 3.13+: honours the affinity mask
    if count is not None:
        return count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


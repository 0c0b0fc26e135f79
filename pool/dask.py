"""pool as the task executor of dask.distributed workers (``pip install 'sturdypool[dask]'``).

Owns: the ``ProcessPool`` it installs in each dask worker, as the worker's default executor
or as a named one that tasks choose with ``dask.annotate(executor=NAME)``; the daemonic
flag of that worker process; and the worker's memory reading, which counts its children.
Runs in: the dask worker process. ``setup`` and ``teardown`` run on the worker's event
loop; the pool's waits run in a thread of their own, never blocking the loop. The tasks
go through the pool's dispatcher thread to its processes.
Guarantees:
- a task that kills its process (segfault, ``os._exit``, SIGKILL, the OOM killer) fails only
  that task, with :class:`pool.WorkerDied` on the client's future. The dask worker, its
  other tasks and its data live on. dask's default executor runs tasks in threads of the
  dask worker, which such a task takes down whole;
- a task's ``sys.exit()`` fails that task too. distributed lets ``SystemExit`` end the
  process it is raised in; a pool task raises it in a pool process, not the dask worker;
- the pool's processes end with the dask worker, however it ends: closed, restarted by its
  nanny, or SIGKILLed. On close, what still runs is terminated, since dask has given those
  tasks up. Each pool process has a lifeline to its parent;
- removing the plugin puts back the executor it replaced at once. What its pool runs
  finishes, then the pool's processes end; at once if the worker begins to close.
Assumes: distributed's ``Worker`` runs a task of a non-thread executor as
``loop.run_in_executor(executor, _run_task_simple, ...)`` and shuts its executors down on
close (true of distributed 2023 onwards). Importing ``pool`` never imports this module.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import TYPE_CHECKING, Any, Callable, Generic, ParamSpec, TypeVar

import click
from distributed import WorkerPlugin
from distributed.core import Status

from ._executor import ProcessPool
from ._worker.forkserver import preload_in_forkserver
from ._futures import PoolFuture
from ._options import default_context

if TYPE_CHECKING:
    from distributed import Worker

__all__ = ["ProcessPoolPlugin", "dask_setup"]

P = ParamSpec("P")
T = TypeVar("T")

# A worker in these states is going away: the scheduler has already taken its tasks back,
# so what still runs in its pool is stopped rather than waited for.
_CLOSING = frozenset({Status.closing, Status.closing_gracefully, Status.closed,
                      Status.failed})


class ProcessPoolPlugin(WorkerPlugin):
    """Run a dask worker's tasks in a ``pool.ProcessPool`` instead of its threads.

    ``client.register_plugin(ProcessPoolPlugin())`` gives every worker of the cluster
    (those that join later too) a pool as its default executor: a task that segfaults, is
    OOM-killed or calls ``os._exit`` fails alone with :class:`pool.WorkerDied`, and the dask
    worker carries on. ``ProcessPoolPlugin("processes")`` installs it under that name
    instead, for the tasks annotated ``dask.annotate(executor="processes")``; the others
    keep running in threads.

    ``max_workers`` defaults to the dask worker's ``nthreads`` (how many tasks it runs at
    once). ``start_method`` is a ``multiprocessing`` start method's name (default:
    forkserver where there is one, else spawn). ``task_timeout``, ``max_memory_per_child``,
    ``max_tasks_per_child``, ``idle_timeout``, ``initializer`` and ``initargs`` are
    ``ProcessPool``'s.

    A dask worker started by a nanny is a daemonic process, which ``multiprocessing``
    forbids to have children (so that none outlives it). The plugin lifts that flag in the
    dask worker process: its pool's processes cannot outlive it either, because each one
    watches its parent and ends itself and its process group when the parent is gone.
    The nanny's view of the worker is unchanged.

    With ``count_children_memory``, the default, the memory the dask worker reports and
    acts on includes its child processes' proportional share (PSS). The worker spills at
    70% and pauses at 80% of its ``memory_limit``. The nanny's restart at 95% still sees the
    worker process only; bound each pool process with ``max_memory_per_child``.

    Removing the plugin, or registering another for the same executor name, takes effect
    at once for new tasks. The old pool finishes what it runs, then ends its processes.
    They are terminated at once if the dask worker closes meanwhile.
    """

    idempotent = False

    def __init__(self, executor: str = "default", *, max_workers: int | None = None,
                 start_method: str | None = None, task_timeout: float | None = None,
                 max_memory_per_child: int | None = None,
                 max_tasks_per_child: int | None = None, idle_timeout: float | None = None,
                 initializer: Callable[..., Any] | None = None,
                 initargs: tuple[Any, ...] = (), count_children_memory: bool = True) -> None:
        if not isinstance(executor, str) or not executor:
            raise TypeError("executor must be a non-empty string (an executor's name)")
        if executor in ("offload", "actor"):
            raise ValueError(f"{executor!r} is an executor dask keeps for itself")
        methods = multiprocessing.get_all_start_methods()
        if start_method is not None and start_method not in methods:
            raise ValueError(f"start_method must be one of {methods}, not {start_method!r}")
        self.executor = executor
        # One plugin per executor name: registering another for the same name replaces it.
        self.name = f"pool-executor-{executor}"
        self.options: dict[str, Any] = dict(
            max_workers=max_workers, task_timeout=task_timeout,
            max_memory_per_child=max_memory_per_child, max_tasks_per_child=max_tasks_per_child,
            idle_timeout=idle_timeout, initializer=initializer, initargs=tuple(initargs))
        self.start_method = start_method
        self.count_children_memory = count_children_memory
        # Bad options fail here, at the call, not in every dask worker's log. A pool made
        # with them and closed at once checks them all; it starts no process or thread.
        # Not in a daemonic process, where no pool can be made: there the plugin is a
        # preload in a dask worker under its nanny, whose setup follows at once and raises
        # the same error.
        if not multiprocessing.current_process().daemon:
            ProcessPool(**self.options).shutdown()
        # Per dask worker: the pool installed there and the executor it replaced, if any.
        # Several dask workers can share one process, as with LocalCluster(processes=False).
        self._installed: dict[int, tuple[_DaskWorkerPool, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_installed"] = {}  # pools stay in their process
        return state

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items()
                            if v is not None and v != ())
        return (f"ProcessPoolPlugin({self.executor!r}{', ' if options else ''}{options}, "
                f"start_method={self.start_method!r})")

    def setup(self, worker: Worker) -> None:
        _allow_children()
        context = (default_context() if self.start_method is None
                   else multiprocessing.get_context(self.start_method))
        if context.get_start_method() == "forkserver":
            _preload_in_forkserver(context)
        options = dict(self.options)
        if options["max_workers"] is None:
            options["max_workers"] = worker.state.nthreads
        worker_pool = _DaskWorkerPool(mp_context=context, **options)
        self._installed[id(worker)] = (worker_pool, worker.executors.get(self.executor))
        worker.executors[self.executor] = worker_pool
        if self.count_children_memory:
            _count_children_memory(worker)

    async def teardown(self, worker: Worker) -> None:
        installed = self._installed.pop(id(worker), None)
        if installed is None:
            return
        worker_pool, replaced = installed
        if worker.executors.get(self.executor) is worker_pool:
            # Tasks that start from now on find the executor that was there before.
            if replaced is None:
                del worker.executors[self.executor]
            else:
                worker.executors[self.executor] = replaced
        if not any(isinstance(e, ProcessPool) for e in worker.executors.values()):
            _stop_counting_children_memory(worker)
        if worker.status in _CLOSING:
            # Dask has given up the tasks still running: it cancelled their awaits and runs
            # them elsewhere. End them now rather than hold up the close.
            await _in_thread(worker_pool.terminate_workers)
        else:
            # Removed or replaced while the worker goes on: what the pool runs finishes,
            # then its processes end. Neither the removal nor the replacement's setup waits
            # for that. The pool stays among the worker's executors under a name no task
            # uses. If the worker closes meanwhile, its close shuts every executor down and
            # so ends this pool too, terminating what still runs.
            worker_pool.shutdown(wait=False)
            worker_pool.terminate_at_shutdown = True
            worker.executors[f"{self.executor} (removed pool {id(worker_pool):x})"] = worker_pool


class _DaskWorkerPool(ProcessPool):
    """The pool of a dask worker: a ``ProcessPool`` whose tasks cannot end the dask worker.

    A task that raises ``SystemExit`` (``sys.exit()``) or ``KeyboardInterrupt`` runs in a
    pool process. But distributed re-raises both on purpose, to shut down the process they
    come from. The pool brings the exception back to the dask worker, whose event loop would
    then end the whole worker. Here such a task fails like any other, with a
    ``RuntimeError`` chained to the original.
    """

    # Set once its plugin is removed: the worker's close then ends the pool at once.
    terminate_at_shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
               ) -> PoolFuture[T]:
        return super().submit(_ExitContained(fn), *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self.terminate_at_shutdown:
            self.terminate_workers(wait=wait)
        else:
            super().shutdown(wait, cancel_futures=cancel_futures)


class _ExitContained(Generic[P, T]):
    """``fn``, with ``SystemExit`` and ``KeyboardInterrupt`` turned into ``RuntimeError``.
    Named as ``fn`` is, so that pool's messages name the task's own function."""

    def __init__(self, fn: Callable[P, T]) -> None:
        self.fn = fn
        self.__qualname__ = getattr(fn, "__qualname__", type(fn).__qualname__)
        self.__module__ = getattr(fn, "__module__", None) or ""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return self.fn(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt) as exc:
            raise RuntimeError(f"the task raised {type(exc).__name__}{exc.args!r}: in "
                               f"pool.dask that fails the task, not the dask worker") from exc


async def _in_thread(end: Callable[[], None]) -> None:
    """Runs a pool's blocking wait for its workers in a thread, off the event loop. Where
    no thread can be started, at interpreter exit, it runs here; the pool's grace periods
    bound the wait."""
    loop = asyncio.get_running_loop()
    try:
        waiting = loop.run_in_executor(None, end)
    except RuntimeError:
        end()
        return
    await waiting


def _allow_children() -> None:
    """Lets this process start the pool's workers even if it is daemonic. The plugin's
    docstring says why that is safe for pool's processes."""
    process = multiprocessing.current_process()
    if process.daemon:
        process.daemon = False


def _preload_in_forkserver(context: Any) -> None:
    """Has the forkserver import what every task of a dask worker imports, so each of the
    pool's processes starts with it. One that must import distributed itself takes ~0.4 s
    to start: the time a death costs before its slot runs again. Measured from a death to
    the next result: 0.40 s without, 0.01 s with. dask sends every task's function by
    value (cloudpickle), so what a plain pool leaves for a task to import is preloaded
    here too."""
    from ._first_task import TASK_MODULES, WORKER_MODULES
    preload_in_forkserver(context, "distributed.worker", *WORKER_MODULES, *TASK_MODULES)


# --- memory -------------------------------------------------------------------------------

def _count_children_memory(worker: Worker) -> None:
    """Make the worker's memory reading include its descendants' resident memory.

    The worker's memory manager (spill, pause) and its reports to the scheduler read
    ``SystemMonitor.get_process_memory``. It is a one-line method of its own, which
    distributed's tests replace too. Here it is replaced on this worker's monitor only.
    Installed once per worker, whatever the number of pools: it counts every descendant,
    so two pools are not counted twice.
    """
    monitor = worker.monitor
    if isinstance(monitor.get_process_memory, _WithChildren):
        return
    # Replacing the bound method with a callable of our own is the point.
    monitor.get_process_memory = _WithChildren(  # type: ignore[method-assign]
        monitor.proc, monitor.get_process_memory)


def _stop_counting_children_memory(worker: Worker) -> None:
    reading: Any = worker.monitor.get_process_memory
    if isinstance(reading, _WithChildren):
        worker.monitor.get_process_memory = reading.own  # type: ignore[method-assign]


class _WithChildren:
    """The worker's own RSS plus its descendant processes' proportional share (PSS). The
    PSS is read at most every ``REFRESH`` seconds: finding descendants scans every process
    of the machine, ~1.4 ms for 75, and each one's PSS costs ~0.2 ms. The memory manager
    reads this every 100 ms.

    PSS, not RSS: forked processes share the pages of the forkserver they come from, where
    distributed itself, some 45 MB, is preloaded. RSS would count those pages once per
    process. PSS divides them among the sharers, so the sum is the memory they really hold.
    Several in-process workers (``LocalCluster(processes=False)``) each count them all, as
    each counts the process's own RSS.
    """

    REFRESH = 0.5

    def __init__(self, proc: Any, own: Callable[[], int]) -> None:
        self.proc = proc
        self.own = own
        self._children = 0
        self._read_at = -float("inf")

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self._read_at >= self.REFRESH:
            self._children = _descendants_memory(self.proc)
            self._read_at = now
        return int(self.own()) + self._children


def _descendants_memory(proc: Any) -> int:
    import psutil  # distributed's own dependency
    total = 0
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        return 0
    for child in children:
        try:
            info = child.memory_full_info()
        except psutil.AccessDenied:  # not ours to read in full: its RSS instead
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        except psutil.Error:  # gone meanwhile
            pass
        else:
            total += getattr(info, "pss", info.rss)  # PSS is Linux's; elsewhere RSS
    return total


# --- preload ------------------------------------------------------------------------------

# The preload's options. One not on the command line is read from dask's configuration,
# key ``pool.NAME``: for example ``DASK_POOL__TASK_TIMEOUT=600`` in the environment. That
# way in does not depend on how the worker is launched.
_PRELOAD_OPTIONS = ("executor", "max-workers", "start-method", "task-timeout",
                    "max-memory-per-child", "max-tasks-per-child")


def _setup(worker: Any, **given: Any) -> Any:
    import dask
    from distributed import Worker
    if not isinstance(worker, Worker):
        raise click.UsageError(f"pool.dask is a worker preload, not one for a "
                               f"{type(worker).__name__} (use --preload on dask worker)")
    options = {}
    for name in _PRELOAD_OPTIONS:
        value = given[f"pool_{name.replace('-', '_')}"]
        options[name.replace("-", "_")] = (dask.config.get(f"pool.{name}", None)
                                           if value is None else value)
    plugin = ProcessPoolPlugin(options.pop("executor") or "default", **options)
    # Awaited by distributed's preload. If it fails, distributed logs the error and the
    # worker starts anyway, running its tasks in threads (docs/guide/dask.rst says so).
    return worker.plugin_add(plugin, catch_errors=False)


# ``dask worker SCHEDULER --preload pool.dask [--pool-max-workers=N ...]``: the same as
# registering ProcessPoolPlugin with these options, on this worker only. A click command,
# because that is how distributed hands a preload its own options: the words after
# ``--preload MODULE`` on dask worker's command line, or LocalCluster's ``preload_argv``.
dask_setup = click.Command("pool.dask", callback=_setup, params=[
    click.Option(["--pool-executor"], default=None,
                 help="the executor's name: 'default' (the default) runs every task in the "
                      "pool; another name, only tasks annotated dask.annotate(executor=NAME)"),
    click.Option(["--pool-max-workers"], type=click.IntRange(min=1), default=None,
                 help="processes in the pool [default: the worker's nthreads]"),
    click.Option(["--pool-start-method"],
                 type=click.Choice(multiprocessing.get_all_start_methods()), default=None,
                 help="[default: forkserver where there is one, else spawn]"),
    click.Option(["--pool-task-timeout"], type=click.FloatRange(min=0, min_open=True),
                 default=None, help="seconds a task may run (no limit by default)"),
    click.Option(["--pool-max-memory-per-child"], type=click.IntRange(min=1), default=None,
                 help="bytes: a process above it after a task is replaced"),
    click.Option(["--pool-max-tasks-per-child"], type=click.IntRange(min=1), default=None,
                 help="replace a process after this many tasks"),
])

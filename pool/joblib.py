"""joblib's ``Parallel`` on pool (``pip install 'sturdypool[joblib]'``): the backend ``"pool"``.

``import pool.joblib`` registers it; then ``joblib.parallel_config(backend="pool",
n_jobs=...)`` runs every ``Parallel`` inside it, scikit-learn's ``n_jobs`` included, on a
``pool.ProcessPool``::

    import pool.joblib
    from joblib import parallel_config
    with parallel_config(backend="pool", n_jobs=4, task_timeout=600):
        search.fit(X, y)

Owns: the backend class (``PoolBackend``), and the pools that backends share, one per
configuration (``_SharedPools``).
Runs in: the caller's thread (``Parallel`` configures, submits and collects) and the pool's
callback threads, where joblib's completion callback dispatches its next batch.
Guarantees:
- a worker's death fails its ``Parallel`` call with :class:`pool.WorkerDied` naming the
  call that was running (its function and arguments, shortened), the signal or exit code
  and the crash-site stack; the next ``Parallel`` call runs at once on the same pool,
  whose slot was refilled. ``task_timeout`` (the longest one call may run) fails it with
  :class:`pool.TaskTimeout` the same way;
- joblib's conventions hold as for its own process backend: ``n_jobs`` (0 is an error,
  negatives count back from the CPU count, 1 runs in the calling process),
  ``batch_size="auto"``, every ``return_as``, ``Parallel(timeout=...)``, the first error
  ending the call with its queued calls cancelled and its running ones stopped, calls
  nested in a task running on threads or in turn, and each worker's BLAS and OpenMP
  threads limited to its share of the cores;
- ``Parallel`` calls with the same configuration reuse one pool's workers, which end after
  ``idle_worker_timeout`` seconds (default 300) with nothing to do. A call with another
  configuration gets a pool of its own; a pool that no running call uses is then shut
  down;
- large numpy arrays, in calls and in results, travel through pool's shared memory.
Assumes: joblib 1.3 or later (``parallel_config``, ``return_as``, ``submit`` and
``retrieve_result_callback`` on backends). Importing ``pool`` never imports this module.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
import warnings
from typing import Any, Callable

from joblib import cpu_count, register_parallel_backend
from joblib._parallel_backends import (AutoBatchingMixin, FallbackToBackend,
                                       ParallelBackendBase, SequentialBackend)
from joblib.parallel import BatchedCalls

from ._errors import TaskInfo, TaskTimeout, WorkerDied, rename_task
from ._executor import ProcessPool
from ._futures import PoolFuture
from ._locks import InterruptSafeLock
from ._options import default_context
from ._worker.batches import Batch, prepare_worker, run_batch
from ._worker.forkserver import preload_in_forkserver
from ._worker.main_guard import check_main_is_guarded
from ._worker.progress import ITEM_PROGRESS

__all__ = ["PoolBackend"]

# The options the backend takes, from parallel_config(backend="pool", ...) or Parallel(...).
OPTIONS = frozenset({"start_method", "task_timeout", "max_memory_per_child",
                     "max_tasks_per_child", "idle_worker_timeout", "initializer",
                     "initargs"})
# What Parallel passes every backend: loky's memory mapping (pool's shared memory takes its
# place), its verbosity, and the multiprocessing context it would use (pool's workers start
# with ``start_method``, as loky's with its own).
_PARALLEL_SETTINGS = frozenset({"max_nbytes", "temp_folder", "mmap_mode", "verbose",
                                "context", "prefer", "require"})


# (joblib ships no types: its classes are Any to the type checker.)
class PoolBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]
    """joblib's backend ``"pool"``: ``Parallel``'s batches run as tasks of a shared
    ``pool.ProcessPool``.

    Options, given to ``parallel_config(backend="pool", ...)`` or to ``Parallel(...)``:

    - ``start_method``: ``"forkserver"`` (the default where there is one), ``"spawn"`` or
      ``"fork"``;
    - ``task_timeout``: the longest one call may run, in seconds; past it the call fails
      with :class:`pool.TaskTimeout` and its worker is replaced. A batch of n calls has n
      times as long in all;
    - ``max_memory_per_child``, ``max_tasks_per_child``: ``ProcessPool``'s, per worker;
    - ``idle_worker_timeout``: seconds a worker may wait for work before it ends (300, as
      loky's);
    - ``initializer``, ``initargs``: run in each worker as it starts.

    ``inner_max_num_threads`` (``parallel_config``'s) sets each worker's BLAS and OpenMP
    thread count; by default it is the worker's share of the cores. joblib's
    ``max_nbytes``, ``mmap_mode`` and ``temp_folder`` are accepted and have no effect:
    arrays of 256 KiB or more go through shared memory.
    """

    supports_retrieve_callback = True
    supports_inner_max_num_threads = True
    uses_threads = False
    supports_sharedmem = False

    def __init__(self, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None, **options: Any) -> None:
        _check_options(options)
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **options)
        # The pools this backend took, one per configure() not yet ended by terminate():
        # more than one while a Parallel call runs inside another's loop, when both got
        # this backend from one parallel_config. Batches go to the last one taken.
        self._held: list[ProcessPool] = []
        self._timeout: float | None = None
        # The batches not yet collected, by their task's future, with their Parallel call:
        # what an abort stops, and what names a death's call. (Each dict operation is
        # atomic.)
        self._batches: dict[PoolFuture[Any], tuple[Batch, Any]] = {}

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """joblib's rules, as its process backends keep them."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if multiprocessing.current_process().daemon:
            if n_jobs != 1:
                warnings.warn("a daemonic process may not have children: the 'pool' "
                              "backend runs the calls in it, one at a time (n_jobs=1)",
                              stacklevel=3)
            return 1
        if not (self.in_main_thread() or self.nesting_level == 0):
            if n_jobs != 1:
                warnings.warn("the 'pool' backend does not start processes for a Parallel "
                              "call nested in a thread of another: setting n_jobs=1",
                              stacklevel=3)
            return 1
        if n_jobs < 0:
            return max(int(cpu_count()) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None,
                  require: Any = None, **options: Any) -> int:
        """Take a shared pool for this configuration; returns the number of workers."""
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        _check_options(options)
        options = {**self.backend_kwargs, **options}
        # Here, at the Parallel call, with joblib's words: a script whose top level runs
        # it outside its __main__ guard would run it again in every worker (loky's do not
        # import the script; forkserver and spawn workers do).
        check_main_is_guarded(_context(options).get_start_method(),
                              "give parallel_config start_method='fork'")
        # Each worker's share of the cores, for its native thread pools (as joblib's own
        # process backends: a variable the user set in this process is kept).
        environment = self._prepare_worker_env(n_jobs)
        threads = _thread_count(self.inner_max_num_threads, n_jobs)
        self.parallel = parallel
        self._held.append(_pools.take(n_jobs, options, environment, threads))
        self._timeout = options.get("task_timeout")
        return n_jobs

    def submit(self, func: Callable[[], Any],
               callback: Callable[[Any], Any] | None = None) -> PoolFuture[Any]:
        """Runs one of joblib's batches (a ``BatchedCalls``) as one task of the pool."""
        if not self._held:
            raise RuntimeError("joblib's 'pool' backend was given a batch after its "
                               "Parallel call ended")
        pool = self._held[-1]
        if isinstance(func, BatchedCalls):
            batch = Batch(func.items, (func._backend, func._n_jobs))
        else:  # a callable of another caller: one call
            batch = Batch([(func, (), {})])
        parallel = getattr(callback, "parallel", self.parallel)
        timeout = None if self._timeout is None else self._timeout * len(batch)
        future = pool.schedule(run_batch, (batch,), timeout=timeout)
        self._batches[future] = (batch, parallel)
        # The caller may have given up (first error, timeout, generator dropped) while a
        # callback thread was here: it sets _aborting, then stops what it finds in
        # _batches. Recorded first and checked after, a batch is stopped by one of us.
        if getattr(parallel, "_aborting", False):
            self._batches.pop(future, None)
            future.stop()
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future: PoolFuture[Any]) -> Any:
        batch, _ = self._batches.pop(future, (None, None))
        try:
            return future.result()
        except (WorkerDied, TaskTimeout) as error:
            if batch is not None:
                _name_the_call(error, batch)
            raise
        except Exception as error:
            # joblib drops the traceback of the error it raises (and pool's holds the
            # call's frames in its worker): they go on as a note.
            _note_worker_frames(error)
            raise

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """The first error (or joblib's timeout, or a generator given up): queued calls are
        cancelled, running ones stopped (their workers replaced): those of the Parallel
        calls that are giving up, not those of another running beside them. The pool
        stays."""
        for future, (_, parallel) in list(self._batches.items()):
            if parallel is None or getattr(parallel, "_aborting", True):
                self._batches.pop(future, None)
                future.stop()

    def terminate(self) -> None:
        """The end of a ``Parallel`` call: the pool it took is given back, for the next to
        reuse."""
        if self._held:
            _pools.give_back(self._held.pop())
        if not self._held:
            self._batches.clear()
        self.reset_batch_stats()

    def __reduce__(self) -> tuple[Any, ...]:
        # Its configuration travels (to a worker, as the backend of nested calls); its
        # pool stays here.
        return (_unpickled_backend,
                (self.nesting_level, self.inner_max_num_threads, self.backend_kwargs))


def _unpickled_backend(nesting_level: int | None, inner_max_num_threads: int | None,
                       options: dict[str, Any]) -> PoolBackend:
    return PoolBackend(nesting_level, inner_max_num_threads, **options)


def _thread_count(inner_max_num_threads: int | None, n_jobs: int) -> int:
    """The threads a worker's native pools get, as joblib's environment gives them: the
    ``inner_max_num_threads`` asked for; else ``OMP_NUM_THREADS`` if set here; else the
    worker's share of the cores."""
    if inner_max_num_threads is not None:
        return inner_max_num_threads
    try:
        return max(int(os.environ["OMP_NUM_THREADS"]), 1)
    except (KeyError, ValueError):
        return max(int(cpu_count()) // n_jobs, 1)


def _check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - OPTIONS - _PARALLEL_SETTINGS)
    if unknown:
        raise TypeError(f"joblib's 'pool' backend has no option {unknown[0]!r}; its options "
                        f"are {', '.join(sorted(OPTIONS))}")


def _name_the_call(error: WorkerDied | TaskTimeout, batch: Batch) -> None:
    """Makes the error name the call of ``batch`` that was running, not the batch."""
    progress = getattr(error, ITEM_PROGRESS, None)
    if progress is not None:
        delattr(error, ITEM_PROGRESS)
    if len(batch) == 1:
        index: int | None = 0
    elif progress is not None and not progress.stopped:
        index = progress.finished
    else:
        index = None  # the worker recorded nothing: any of them
    if index is None:
        error.add_note(f"(one of a batch of {len(batch)} joblib calls)")
        return
    if index >= len(batch):
        error.add_note(f"(after all {len(batch)} calls of its batch had finished, as it sent "
                       f"their results)")
        return
    rename_task(error, TaskInfo(error.task.task_id, *batch.call(index)))
    if len(batch) > 1:
        error.add_note(f"(call {index + 1} of a batch of {len(batch)}: the calls before it "
                       f"had finished)")


_OWN_DIRECTORY = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _note_worker_frames(error: BaseException) -> None:
    """Adds to ``error`` a note with the frames of its traceback outside pool: the call's
    own, in its worker."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not os.path.abspath(frame.filename).startswith(_OWN_DIRECTORY)]
    if frames:
        error.add_note("The call's traceback in its worker (most recent call last):\n"
                       + "".join(traceback.format_list(frames)).rstrip())


class _SharedPool:
    """A pool, the configuration it was made for, and how many ``Parallel`` calls use it."""

    __slots__ = ("settings", "pool", "users")

    def __init__(self, settings: tuple[Any, ...], pool: ProcessPool) -> None:
        self.settings = settings
        self.pool = pool
        self.users = 1


class _SharedPools:
    """The pools of ``PoolBackend``s, one per configuration: successive ``Parallel`` calls
    with the same one reuse its warm workers, as loky's reusable executor does."""

    def __init__(self) -> None:
        self._lock = InterruptSafeLock()  # (taken in the caller's thread: Ctrl-C safe)
        self._shared: list[_SharedPool] = []

    def take(self, n_jobs: int, options: dict[str, Any], environment: dict[str, str],
             threads: int) -> ProcessPool:
        options = dict(options, initargs=tuple(options.get("initargs") or ()))
        settings = (n_jobs, sorted(environment.items()),
                    *[options.get(name) for name in sorted(OPTIONS)])
        with self._lock:
            for shared in self._shared:
                if _equal(shared.settings, settings) and _usable(shared.pool):
                    shared.users += 1
                    return shared.pool
            unused = [shared.pool for shared in self._shared if shared.users <= 0]
            self._shared = [shared for shared in self._shared if shared.users > 0]
            pool = _new_pool(n_jobs, options, environment, threads)
            self._shared.append(_SharedPool(settings, pool))
        for old in unused:  # (their workers are idle: no call of theirs runs)
            old.shutdown(wait=False)
        return pool

    def give_back(self, pool: ProcessPool) -> None:
        with self._lock:
            for shared in self._shared:
                if shared.pool is pool:
                    shared.users -= 1

    def __len__(self) -> int:
        return len(self._shared)


def _usable(pool: ProcessPool) -> bool:
    """Not shut down, and not broken: a pool whose initializer failed in every worker it
    started (or whose dispatcher failed) is not given to another call."""
    dispatcher = pool._dispatcher
    return not dispatcher.closing and dispatcher.broken_error is None


def _equal(a: Any, b: Any) -> bool:
    """Settings compare by value, where values say plainly whether they are equal (an
    array among the initializer's arguments does not: it is the same only if it is the
    same object)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(map(_equal, a, b))
    try:
        same = a == b
    except Exception:  # (a comparison that refuses)
        return False
    return same if isinstance(same, bool) else False


def _context(options: dict[str, Any]) -> Any:
    """The multiprocessing context of ``start_method`` (a name): pool's default if none."""
    method = options.get("start_method")
    return default_context() if method is None else multiprocessing.get_context(method)


def _new_pool(n_jobs: int, options: dict[str, Any], environment: dict[str, str],
              threads: int) -> ProcessPool:
    context = _context(options)
    if context.get_start_method() == "forkserver":
        # Workers forked with joblib (and numpy, which it imports) already loaded start in
        # milliseconds, not the quarter of a second those imports take: what a call waits
        # for after a death or an abort. The forkserver is the program's: the workers of
        # its other pools start with them loaded too (a script that imports joblib has
        # them in its __main__, which it preloads anyway). One already running keeps its
        # own.
        preload_in_forkserver(context, "joblib", "pool.joblib")
    idle = options.get("idle_worker_timeout")
    return ProcessPool(
        n_jobs, mp_context=context, initializer=prepare_worker,
        initargs=(environment, threads, PoolBackend, options.get("initializer"),
                  options["initargs"]),  # (a tuple: _SharedPools.take)
        task_timeout=None,  # (per batch: PoolBackend.submit)
        max_memory_per_child=options.get("max_memory_per_child"),
        max_tasks_per_child=options.get("max_tasks_per_child"),
        idle_timeout=300.0 if idle is None else idle)


_pools = _SharedPools()

register_parallel_backend("pool", PoolBackend)

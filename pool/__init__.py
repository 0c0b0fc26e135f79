"""pool: a drop-in ``concurrent.futures`` process pool where a worker's death is an
explained failure of one task, not a broken pool.

Swap ``from concurrent.futures import ProcessPoolExecutor`` for
``from pool import ProcessPoolExecutor`` (or ``ProcessPool``); see README.rst.

The packages, by role. Each module opens with what it owns, runs in, guarantees and
assumes; docs/architecture.rst walks through them.

- the API, here: ``_executor`` (``ProcessPool``, with ``_options`` for its arguments,
  ``_first_task`` for what its first task needs done first and ``_stdlib_attributes``
  for the stdlib's private attributes it keeps), ``_mapping`` (``map``), ``_aio``
  (asyncio), ``_progress``, ``_stats``, ``_shared`` (``pool.shared()``), ``_to_process``,
  ``_patch`` (``pool.patch()``, with ``_patched`` and the start-up hook in ``_startup``),
  ``_futures`` (``PoolFuture``), ``_mp_pool`` (``pool.Pool``, the ``multiprocessing.Pool``
  face, with ``_mp_results`` for what it hands back), ``_latch`` (how callers wait),
  ``_callbacks`` (the threads that run done-callbacks), ``_errors``, ``_exit`` (the pools
  and the process's life: interpreter exit, fork), ``_compat`` (the stdlib's private
  names that pool relies on); ``dask`` (optional, never imported here);
- ``_dispatcher``: the dispatcher thread and what callers hand it;
- ``_core``: the state machine, pure (events in, actions out);
- ``_worker``: one worker process, its main and the parent's handle on it;
- ``_wire``: frames, pipes, pickling and the limits that relate them;
- ``_cli``: the command line (``python -m pool``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time these load on first use (below)
    from ._aio import as_completed_async
    from ._errors import (ArgumentPicklingError, ArgumentUnpicklingError, InitializerError,
                          PoolInternalError, RemoteTaskError, ResultTransferError, TaskInfo,
                          SharedPoolConflict, TaskTimeout, WorkerDied, WorkerProtocolError,
                          WorkerStartRefused, WorkerTerminated)
    from ._executor import ProcessPool, ProcessPoolExecutor
    from ._futures import PoolFuture
    from ._mp_pool import Pool
    from ._mp_results import AsyncResult, IMapIterator, MapResult
    from ._patch import Patch, patch
    from ._progress import as_completed
    from ._shared import Lease, shared
    from ._to_process import to_process
    from ._stats import PoolStats, WorkerStats

# Loaded on first use, not by ``import pool``. Every worker process imports this package,
# since its main is in ``pool._worker``. It needs none of the executor, the dispatcher,
# asyncio or the errors, whose base class BrokenProcessPool brings
# concurrent.futures.process. Under spawn and forkserver each worker start paid for them.
_LAZY = {
    **dict.fromkeys(("ArgumentPicklingError", "ArgumentUnpicklingError", "InitializerError",
                     "PoolInternalError", "RemoteTaskError", "ResultTransferError",
                     "TaskInfo", "SharedPoolConflict", "TaskTimeout", "WorkerDied",
                     "WorkerProtocolError", "WorkerStartRefused", "WorkerTerminated"),
                    "_errors"),
    "as_completed_async": "_aio",
    "ProcessPool": "_executor", "ProcessPoolExecutor": "_executor",
    "PoolFuture": "_futures",
    "Pool": "_mp_pool",
    "AsyncResult": "_mp_results", "MapResult": "_mp_results", "IMapIterator": "_mp_results",
    "Patch": "_patch", "patch": "_patch",
    "as_completed": "_progress",
    "Lease": "_shared", "shared": "_shared", "to_process": "_to_process",
    "PoolStats": "_stats", "WorkerStats": "_stats",
}


def __getattr__(name: str) -> Any:
    import importlib
    module_name = _LAZY.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(f".{module_name}", __name__), name)
        globals()[name] = value  # later lookups find it here, not in __getattr__
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "ProcessPool",
    "ProcessPoolExecutor",
    "Pool",
    "AsyncResult",
    "MapResult",
    "IMapIterator",
    "PoolFuture",
    "PoolStats",
    "as_completed",
    "as_completed_async",
    "to_process",
    "WorkerStats",
    "shared",
    "Lease",
    "patch",
    "Patch",
    "WorkerDied",
    "TaskTimeout",
    "WorkerTerminated",
    "InitializerError",
    "WorkerStartRefused",
    "PoolInternalError",
    "WorkerProtocolError",
    "RemoteTaskError",
    "ResultTransferError",
    "ArgumentPicklingError",
    "ArgumentUnpicklingError",
    "SharedPoolConflict",
    "TaskInfo",
    "__version__",
]

# The one place the version is written (setup.cfg reads it: ``attr: pool.__version__``).
__version__ = "0.2.0"

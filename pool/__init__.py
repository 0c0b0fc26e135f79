"""pool: a drop-in ``concurrent.futures`` process pool where a worker's death is an
explained failure of one task, not a broken pool.

Swap ``from concurrent.futures import ProcessPoolExecutor`` for
``from pool import ProcessPoolExecutor`` (or ``ProcessPool``); see README.rst.
"""

from __future__ import annotations

from ._errors import (ArgumentPicklingError, InitializerError, PoolInternalError,
                      RemoteTaskError, ResultTransferError, TaskInfo, TaskTimeout, WorkerDied,
                      WorkerProtocolError, WorkerTerminated)
from ._executor import ProcessPool, ProcessPoolExecutor
from ._futures import PoolFuture

__all__ = [
    "ProcessPool",
    "ProcessPoolExecutor",
    "PoolFuture",
    "WorkerDied",
    "TaskTimeout",
    "WorkerTerminated",
    "InitializerError",
    "PoolInternalError",
    "WorkerProtocolError",
    "RemoteTaskError",
    "ResultTransferError",
    "ArgumentPicklingError",
    "TaskInfo",
]

"""pool: a drop-in ``concurrent.futures`` process pool where a worker's death is an
explained failure of one task, not a broken pool.

Swap ``from concurrent.futures import ProcessPoolExecutor`` for
``from pool import ProcessPoolExecutor`` (or ``ProcessPool``); see README.rst.
"""

from __future__ import annotations

from ._errors import (ArgumentPicklingError, InitializerError, PoolInternalError,
                      RemoteTaskError, ResultTransferError, TaskInfo, WorkerDied,
                      WorkerProtocolError)
from ._executor import ProcessPool, ProcessPoolExecutor

__all__ = [
    "ProcessPool",
    "ProcessPoolExecutor",
    "WorkerDied",
    "InitializerError",
    "PoolInternalError",
    "WorkerProtocolError",
    "RemoteTaskError",
    "ResultTransferError",
    "ArgumentPicklingError",
    "TaskInfo",
]

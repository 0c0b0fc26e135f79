"""pool: a drop-in ``concurrent.futures`` process pool where a worker's death is an
explained failure of one task, not a broken pool.

Swap ``from concurrent.futures import ProcessPoolExecutor`` for
``from pool import ProcessPoolExecutor`` (or ``ProcessPool``); see README.rst.
"""

from __future__ import annotations

from ._errors import (ArgumentPicklingError, ArgumentUnpicklingError, InitializerError,
                      PoolInternalError, RemoteTaskError, ResultTransferError, TaskInfo,
                      TaskTimeout, WorkerDied, WorkerProtocolError, WorkerTerminated)
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
    "ArgumentUnpicklingError",
    "TaskInfo",
    "__version__",
]

# The one place the version is written (setup.cfg reads it: ``attr: pool.__version__``).
__version__ = "0.2.0"

# The public names are documented, printed and pickled as ``pool.X``, not as the private
# module that happens to define them (``pool._errors.WorkerDied``). Pickles by reference
# resolve through this module, which exports every one of them.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj

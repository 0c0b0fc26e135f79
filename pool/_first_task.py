"""What a pool does once, in the caller's thread, before it hands the dispatcher its first
task: the checks that fail at once where workers would not work, and the preparations
that make every worker start cheaper.

Owns: ``WORKER_MODULES``, the modules a worker imports, which a forkserver imports for it.
Runs in: a caller's thread, in the first ``submit``, ``map`` or ``amap`` of a pool (and,
for ``WORKER_MODULES``, ``pool.dask`` before its pools start).
Guarantees: a main script without its ``__main__`` guard fails here, with the fix, and
nothing is sent. Under forkserver, the pool's worker modules are on the forkserver's
preload list if it has not started yet; under fork they are imported here, before any
fork. What the program printed so far is flushed before any worker prints.
Assumes: the pool has handed its dispatcher no task yet, so none of its workers started.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from ._worker.forkserver import preload_in_forkserver
from ._worker.main_guard import check_main_is_guarded, remember_main_script

# A worker's own modules: a forkserver imports them once, before it forks any worker,
# instead of every worker after its fork. Not those a worker imports only when a task needs
# them (cloudpickle for a function sent by value, tblib for an exception, the pool's
# errors): the forkserver's start is on the way to a program's first result (21 ms of 90,
# measured), and a short script that runs one task should not pay for what it does not use.
# Under fork the parent imports those too (see before_first_task).
WORKER_MODULES = ("pool._worker.main",)
TASK_MODULES = ("pool._errors", "cloudpickle", "tblib.pickling_support")
# Imported by the dispatcher thread after its first turn (see _dispatcher.loop): under fork,
# before any fork instead, as the modules above.
FORK_MODULES = (*TASK_MODULES, "pool._stats")


def before_first_task(mp_context: Any) -> None:
    """Fail at once, with the fix, where workers would re-run the caller's own code (a main
    script without its ``__main__`` guard); then prepare for the workers to start."""
    method = mp_context.get_start_method()
    check_main_is_guarded(method)
    remember_main_script()
    if method == "forkserver":  # so that a worker starts at the cost of a fork
        preload_in_forkserver(mp_context, *WORKER_MODULES)
    elif method == "fork":
        # What a worker imports when a task first needs it, imported here, before any
        # fork: a fork while another thread of this process imports a module leaves
        # the child that module's import lock, held by a thread it does not have.
        for name in WORKER_MODULES + FORK_MODULES:
            importlib.import_module(name)
    # What the program printed before its first task comes out before what workers
    # print. The stdlib flushes before each start; the pool's thread does not, since a
    # full stdout pipe would hold up the whole pool. So the caller's thread flushes
    # here, once.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError, AttributeError):
            pass

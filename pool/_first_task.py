"""What a pool does once, in the caller's thread, before it hands the dispatcher its first
task: the checks that fail at once where workers would not work, and the preparations
that make every worker start cheaper.

Owns: ``WORKER_MODULES``, the modules a worker imports, which a forkserver imports for it,
and the forkserver's early start (``start_forkserver_early``).
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

from . import _compat
from ._worker.forkserver import preload_in_forkserver, start_holding_stop_signals
from ._worker.main_guard import check_main_is_guarded, remember_main_script

# A worker's own modules: a forkserver imports them once, before it forks any worker,
# instead of every worker after its fork. Not those a worker imports only when a task needs
# them (cloudpickle for a function sent by value, tblib for an exception, the pool's
# errors): the forkserver's start is on the way to a program's first result (21 ms of 90,
# measured), and a short script that runs one task should not pay for what it does not use.
# Under fork the parent imports those too (see before_first_task).
WORKER_MODULES = ("pool._worker.main",)
TASK_MODULES = ("pool._errors", "cloudpickle", "tblib.pickling_support")


def start_forkserver_early(mp_context: Any) -> None:
    """Under forkserver, start the forkserver as the pool is made, before the pool imports
    its own machinery: the forkserver's start (an interpreter, and its preloads) then runs
    beside those imports instead of after them (a script's first result: 90 ms -> 70 ms,
    benchmarks/startup.py). Only where the first task's check would pass: a forkserver
    imports the main script, and one without its ``__main__`` guard would run again there
    (the first ``submit`` says so, as before)."""
    if mp_context.get_start_method() != "forkserver" or _compat.forkserver_pid() is not None:
        return
    try:
        check_main_is_guarded("forkserver")
    except RuntimeError:
        return
    preload_in_forkserver(mp_context, *WORKER_MODULES)
    from multiprocessing import forkserver

    from ._worker.main import STOP_SIGNALS
    # As a worker's start would have started it: a Ctrl-C or SIGTERM to the program's
    # group must not end it (see _worker.handle._start_holding_stop_signals).
    _compat.start_resource_tracker()
    start_holding_stop_signals(forkserver.ensure_running, STOP_SIGNALS)


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
        for name in WORKER_MODULES + TASK_MODULES:
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

"""What the forkserver has imported before it forks a worker.

Owns: nothing; one function.
Runs in: a caller's thread, before a pool's first worker starts (``ProcessPool``,
``pool.dask``).
Guarantees: modules are added to the forkserver's preload list only before the forkserver
starts; it reads the list once, then forks every worker from what it has imported. They
go after the modules already asked for, never in their place: the user's own
``set_forkserver_preload`` and the default ``__main__`` still come first. A forkserver
that is already running is left as it is.
Why: a worker forked from a forkserver that has not imported ``pool._worker.main`` imports
it itself, at every start and every refill after a death; for a dask worker,
``distributed`` too. One forked from a forkserver that has them starts at the cost of a
fork.
Assumes: multiprocessing keeps the forkserver's pid and preload list where ``_compat``
reads them (checked on 3.11 to 3.15).
"""

from __future__ import annotations

from typing import Any

from .. import _compat


def preload_in_forkserver(context: Any, *modules: str) -> None:
    if _compat.forkserver_pid() is not None:
        return  # already running: it keeps what it has
    preload = _compat.forkserver_preload()
    missing = [name for name in modules if name not in preload]
    if missing:
        context.set_forkserver_preload(preload + missing)

"""``pool.to_process``: ``asyncio.to_thread`` for work that needs a process.

Owns: nothing; one coroutine function over the shared pool (``_shared``).
Runs in: the caller's event loop thread.
Guarantees: importing it imports nothing else of pool: a main script that does
``from pool import to_process`` is imported again by every spawn and forkserver worker, and
the shared pool, the executor and the errors load only when the first call runs.
Assumes: ``_shared`` never imports this module (no cycle through its lazy import).
"""

from __future__ import annotations

from typing import Callable, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def to_process(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(*args, **kwargs)`` in a worker process and return its result, without
    blocking the event loop: ``asyncio.to_thread`` for work that needs a process (CPU-bound
    Python, code that may crash or hang).

    It runs on the process-wide shared pool (:func:`pool.shared`), made at the first call
    if there is none yet (a worker per CPU; idle workers exit after a minute and start
    again on demand), and ended at interpreter exit. Cancelling the call stops the task,
    killing its worker if it runs; a worker's death raises :class:`pool.WorkerDied`.
    ``fn``, its arguments and its result must be picklable, as with ``submit``. For options
    (timeouts, ``initializer``), use a pool of your own and its :meth:`ProcessPool.run`.
    """
    # A lease on the shared pool, whatever its options (a call that names none never
    # conflicts), dropped once the task is submitted: releasing it leaves the task, and the
    # pool, running. Cancelling the await stops the task (``PoolFuture.__await__``).
    from ._shared import shared
    return await shared().submit(fn, *args, **kwargs)

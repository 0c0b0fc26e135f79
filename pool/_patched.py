"""The class ``pool.patch()`` and ``python -m pool run`` put in place of
``concurrent.futures.ProcessPoolExecutor``: pool's executor, with the stdlib's choice of
start method when the caller gives none.

Owns: nothing but that default.
Runs in: the caller's thread.
Guarantees: code written for the stdlib's class gets the context the stdlib would use. That
is ``multiprocessing.get_context()``: the program's ``set_start_method()``, else the
platform's default, ``fork`` on Linux before 3.14. With ``max_tasks_per_child`` it is
``spawn``. So what that code made for the context works as before: tqdm's ``process_map``
passes a lock of the default context in ``initargs``, and a lock cannot cross to workers
of another context. Code that builds ``pool.ProcessPoolExecutor`` itself keeps pool's
default, forkserver.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable

from ._executor import ProcessPool


class ProcessPoolExecutor(ProcessPool):
    # Named as the class it stands in for, though pool.ProcessPoolExecutor is another:
    # code written for the stdlib may print or check type(executor).__name__.
    """``pool.ProcessPoolExecutor`` as ``pool.patch()`` gives it to code written for the
    stdlib's. With no ``mp_context``, the start method is the one the stdlib would use,
    not pool's forkserver: ``multiprocessing.get_context()``, or ``spawn`` with
    ``max_tasks_per_child``. Everything else is ``pool.ProcessPoolExecutor``'s."""

    def __init__(self, max_workers: int | None = None, mp_context: Any = None,
                 initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = (),
                 *, max_tasks_per_child: int | None = None, **options: Any) -> None:
        if mp_context is None:   # as concurrent.futures.process decides it, 3.11-3.14
            mp_context = multiprocessing.get_context(
                "spawn" if max_tasks_per_child is not None else None)
        super().__init__(max_workers, mp_context, initializer, initargs,
                         max_tasks_per_child=max_tasks_per_child, **options)


# The classes made so far, by the stand-in they subclass (one per patch: see
# ``mp_pool_class``).
_mp_classes: dict[type, type] = {}


def mp_pool_class(stand_in: type) -> type:
    """``pool.Pool`` as the class ``pool.patch()`` and ``python -m pool run`` make in place
    of ``multiprocessing.pool.Pool``: a subclass of both pool's face and the stand-in that
    took the stdlib's name (itself the stdlib's subclass), so that
    ``isinstance(p, multiprocessing.pool.Pool)`` still holds. pool's methods come first;
    the stdlib's ``__init__`` and threads are never used. Its default context is the
    stdlib's, as ``pool.Pool``'s is."""
    made = _mp_classes.get(stand_in)
    if made is None:
        from ._mp_pool import Pool as Face
        made = type("Pool", (Face, stand_in), {"__module__": __name__, "__qualname__": "Pool",
                                               "__doc__": Face.__doc__})
        made = _mp_classes.setdefault(stand_in, made)
    return made

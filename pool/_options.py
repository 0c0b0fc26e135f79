"""The options a ``ProcessPool`` is made with, and a call's ``timeout``: checked, with
their defaults filled in, in the form the dispatcher takes.

Owns: nothing that lives on; what the checks raise and which defaults apply.
Runs in: a caller's thread, in the constructor (``checked_options``) and at a call that
takes a ``timeout`` (``seconds``).
Guarantees: a bad argument fails in the constructor, before anything is started, with
the stdlib's exception type (``TypeError`` for the wrong type, ``ValueError`` for a wrong
value) and a message naming it. An initializer or initargs that cannot be sent to a worker
fail here too, not in every worker. Nothing here imports the dispatcher or the core at
import time: every worker under spawn and forkserver imports this module, through
``from pool import ProcessPool`` in the main script it runs again.
Assumes: ``ProcessPool`` passes its arguments on as it was given them; their defaults are
in its signature, where ``pool._shared`` reads them.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from . import _platform
from ._wire import pickling as _pickling
from ._worker.main_guard import check_not_daemonic

if TYPE_CHECKING:
    from ._core.states import Timeouts
    from ._worker.main import Initializer


class _PoolDefault:
    def __repr__(self) -> str:
        return "<the pool's task_timeout>"


# The default of a call's ``timeout``: the pool's ``task_timeout``. ``None`` means no limit.
POOL_DEFAULT: Any = _PoolDefault()


class PoolOptions(NamedTuple):
    """A ``ProcessPool``'s arguments once checked, with their defaults filled in."""

    max_workers: int
    mp_context: Any
    initializer: Initializer | None  # the function and its arguments, ready to travel
    max_tasks_per_child: int | None
    max_memory_per_child: int | None
    task_timeout: float | None       # the executor's: the dispatcher takes it per task
    idle_timeout: float | None
    timeouts: Timeouts               # stop_grace, terminate_grace and kill_grace


def checked_options(max_workers: int | None, mp_context: Any,
                    initializer: Callable[..., Any] | None, initargs: tuple[Any, ...], *,
                    max_tasks_per_child: int | None, task_timeout: float | None,
                    max_memory_per_child: int | None, idle_timeout: float | None,
                    stop_grace: float, terminate_grace: float, kill_grace: float
                    ) -> PoolOptions:
    """``ProcessPool``'s arguments, checked (see its docstring for what they mean). Also
    raises if this process may not have children."""
    if max_workers is None:
        max_workers = usable_cpu_count()
    elif not isinstance(max_workers, int) or isinstance(max_workers, bool):
        raise TypeError("max_workers must be an integer")
    elif max_workers <= 0:
        raise ValueError("max_workers must be greater than 0")
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be a callable")
    if max_tasks_per_child is not None:
        if not isinstance(max_tasks_per_child, int) or isinstance(max_tasks_per_child, bool):
            raise TypeError("max_tasks_per_child must be an integer")
        if max_tasks_per_child <= 0:
            raise ValueError("max_tasks_per_child must be >= 1")
    if max_memory_per_child is not None:
        if (not isinstance(max_memory_per_child, int)
                or isinstance(max_memory_per_child, bool)):
            raise TypeError("max_memory_per_child must be an integer (bytes)")
        if max_memory_per_child <= 0:
            raise ValueError("max_memory_per_child must be > 0")
    task_timeout = seconds("task_timeout", task_timeout, optional=True)
    idle_timeout = seconds("idle_timeout", idle_timeout, optional=True)
    # Imported here: a worker that imports this module needs neither.
    from ._core.states import Timeouts
    from ._worker.main import Initializer, prepare_initargs
    timeouts = Timeouts(stop=seconds("stop_grace", stop_grace),
                        terminate=seconds("terminate_grace", terminate_grace),
                        kill=seconds("kill_grace", kill_grace))
    check_not_daemonic()
    if mp_context is None:
        mp_context = default_context()
    initializer_setup = None
    if initializer is not None:
        # Checked here, so that a bad initializer or initargs fail in the constructor,
        # not in every worker; see Initializer for how they travel.
        initializer_setup = Initializer(_pickling.dumps_callable(initializer),
                                        prepare_initargs(tuple(initargs), mp_context))
    return PoolOptions(max_workers=max_workers, mp_context=mp_context,
                       initializer=initializer_setup,
                       max_tasks_per_child=max_tasks_per_child,
                       max_memory_per_child=max_memory_per_child, task_timeout=task_timeout,
                       idle_timeout=idle_timeout, timeouts=timeouts)


def seconds(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` as a float number of seconds, > 0 and finite; or None, if ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number of seconds{' or None' if optional else ''}")
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be > 0 and finite, not {value!r}")
    return float(value)


def default_context() -> Any:
    """forkserver where the platform has it (the 3.14 default on Linux), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def usable_cpu_count() -> int:
    """The CPUs this process may run on: the default ``max_workers``."""
    count = getattr(os, "process_cpu_count", None)  # 3.13+: honours the affinity mask
    if count is not None:
        return count() or 1
    if _platform.CPU_AFFINITY:
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1

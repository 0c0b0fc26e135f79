"""What caller threads hand the dispatcher: task records and the commands that carry them.

Owns: nothing but these value types. Created in callers' threads, consumed in the
dispatcher thread (through its command queue).
Guarantees: a ``Submission`` is the only place a submitted task's future and encoded call
live; the dispatcher pops it when the task ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

from .._errors import TaskInfo
from .._futures import Latch, PoolFuture
from .._wire.frames import Buffers


@dataclass(eq=False, slots=True)
class Submission:
    """A submitted task as the dispatcher tracks it."""

    info: TaskInfo
    future: PoolFuture[Any]
    body: Buffers            # the CALL frame's body
    frame_bytes: int         # the whole CALL frame's size, header included
    timeout: float | None    # seconds it may run, from the moment it starts
    marked_running: bool = False


# A call ready to submit: the function, its arguments (kept for TaskInfo) and the
# encoded CALL body.
EncodedCall = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Buffers]


@dataclass(frozen=True, slots=True)
class Submit:
    records: list[Submission]  # one submit(), or a group of map()'s, in order


@dataclass(frozen=True, slots=True)
class Shutdown:
    cancel_futures: bool


@dataclass(frozen=True, slots=True)
class StopTask:
    task_id: int


@dataclass(frozen=True, slots=True)
class Terminate:
    signum: int  # SIGTERM (terminate_workers) or SIGKILL (kill_workers)


@dataclass(frozen=True, slots=True)
class Sync:
    """Set ``done`` once every command queued before this one has been acted on."""
    done: Latch


Command = Union[Submit, Shutdown, StopTask, Terminate, Sync]

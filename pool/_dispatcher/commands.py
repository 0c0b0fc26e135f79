"""What crosses the thread boundary: what callers hand the loop, and what the loop may do
with the object they hold.

Owns: the value types callers queue for the loop (a ``Submission`` per task, and the
commands that carry them), and ``Front``: the part of the ``Dispatcher`` the loop uses.
Runs in: commands are made in callers' threads and consumed in the dispatcher thread,
through the front's queue; ``Front``'s methods are called by the dispatcher thread only.
Guarantees: a ``Submission`` is the only place a submitted task's future and encoded call
live; the loop pops it when the task ends.
Assumes: nothing; these are types only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Union

from .._core.values import value_type

from .._errors import TaskInfo
from .._futures import PoolFuture
from .._latch import Latch
from .._wire.frames import Buffers

if TYPE_CHECKING:
    from .._stats import PoolStats


@value_type(eq=False)
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


@value_type(frozen=True)
class Submit:
    submissions: list[Submission]  # one submit(), or a group of map()'s, in order


@value_type(frozen=True)
class Shutdown:
    cancel_futures: bool


@value_type(frozen=True)
class StopTask:
    task_id: int


@value_type(frozen=True)
class Terminate:
    signum: int  # SIGTERM (terminate_workers) or SIGKILL (kill_workers)


@value_type(frozen=True)
class Sync:
    """Set ``done`` once every command queued before this one has been acted on."""
    done: Latch


Command = Union[Submit, Shutdown, StopTask, Terminate, Sync]


class Front(Protocol):
    """What the loop may do with the ``Dispatcher`` its callers hold: take what they
    queued, publish what they read, and move the admission. Dispatcher thread only."""

    name: str
    broken_error: BaseException | None  # read by the loop; written through the methods

    def owns_loop(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is the one started to run the loop (see ``_start_thread``);
        asked by that thread before it runs."""

    def take_commands(self) -> Iterator[Command]:
        """The commands queued so far, in order."""

    def take_cancels(self) -> list[int]:
        """The ids of the tasks callers cancelled since the last call."""

    def publish_processes(self, processes: dict[int, Any]) -> None:
        """The live workers' ``Process`` objects by pid."""

    def publish_census(self, census: tuple[int, int], stats: PoolStats) -> None:
        """The machine's census and the stats, for the caller that asked."""

    def pool_broken(self, error: BaseException) -> None:
        """Workers cannot start: ``submit`` raises ``error`` from now on."""

    def loop_failed(self, error: BaseException) -> None:
        """The loop raised: ``submit`` raises ``error``; the admission is FAILED."""

    @property
    def failed(self) -> bool:
        """The loop failed: the machine's records describe nothing any more."""

    def loop_ended(self) -> bool:
        """No command reaches the loop from now on; False if that was already so."""

    def signal_ended(self) -> None:
        """Wake every caller waiting for the end (once the admission is ENDED)."""

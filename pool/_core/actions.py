"""The actions the state machine asks the dispatcher to carry out.

Owns: nothing but these value types. Runs in: the dispatcher thread.
Guarantees: each is immutable; ``Send`` and ``Resolve``, made for every task, only by
convention, as a frozen value's ``__init__`` costs three times a plain one's. Each
names its slot by ``index`` and its task by ``task_id``, never by object: a ``Slot``
record is the machine's own, and everywhere else a slot is its index.
The facts an action needs from the event that caused it (a reply's outcome, a dead worker's
``Exit``, why a worker is called misbehaving) travel in it, opaque to the machine and left
out of comparisons, so that the dispatcher acts on each where it arrives.
Assumes: the dispatcher carries out each action once, in the order given.
"""

from __future__ import annotations

import enum
from .values import field, value_type
from typing import Any, Union


def _payload(default: Any = None) -> Any:
    """A fact carried for the dispatcher: not part of what the action is."""
    return field(default=default, compare=False, repr=False)


@value_type(frozen=True)
class Spawn:
    index: int


@value_type()  # not frozen: see the module docstring
class Send:
    index: int
    task_id: int


@value_type()  # not frozen: see the module docstring
class Resolve:
    """The task's reply is final: deliver it to the future. ``outcome``: ``(True, value)``
    or ``(False, exception)``, as the reply was decoded."""
    task_id: int
    outcome: Any = _payload()


class FailCause(enum.Enum):
    """Why a task failed without a reply of its own: what the dispatcher's error says."""

    DIED = "died"              # its worker died while running it
    TIMED_OUT = "timed out"    # it overran its timeout; its worker was asked for its stack,
                               # then ended
    TERMINATED = "terminated"  # terminate_workers() or kill_workers() ended its worker
    MISBEHAVED = "misbehaved"  # its worker sent bytes that are not a reply, or a frame out
                               # of turn
    BROKEN = "broken"          # it was queued when the pool stopped starting workers
    REFUSED = "refused"        # it was queued while the system kept refusing worker starts
                               # and no worker was left to run it; the pool stays open


@value_type(frozen=True)
class Fail:
    """The task failed for ``cause``. ``index`` is the slot whose worker was running it
    (``None`` for a queued task); ``timeout``, the limit it overran (``TIMED_OUT`` only);
    ``exited``, what is known of its worker's end; ``reason``, how the worker misbehaved."""
    task_id: int
    cause: FailCause
    index: int | None = None
    timeout: float | None = None
    exited: Any = _payload()
    reason: str = _payload("")


@value_type(frozen=True)
class Stopped:
    """The caller stopped this task: it never started, or (``ran``) its worker was killed."""
    task_id: int
    ran: bool = False


@value_type(frozen=True)
class Cancel:
    """shutdown(cancel_futures=True) cancels this queued task."""
    task_id: int


@value_type(frozen=True)
class Reclaim:
    """Take back the tasks that wait in the slot's pipe behind its running one (the
    dispatcher reports which it got with ``tasks_reclaimed``)."""
    index: int


@value_type(frozen=True)
class AskToExit:
    """Ask the slot's worker to exit (close its task pipe)."""
    index: int


@value_type(frozen=True)
class Signal:
    """Send a signal to the slot's worker and to its process group."""
    index: int
    signum: int


@value_type(frozen=True)
class DumpStack:
    """Ask the slot's worker (not its group) to write its Python stack, then exit."""
    index: int


@value_type(frozen=True)
class Misbehaved:
    """The slot's worker broke the protocol (``reason`` says how): log it, read nothing
    more from it. Its running task's ``Fail`` and its kill follow."""
    index: int
    reason: str = _payload("")


class Departure(enum.Enum):
    """How a worker that is gone left, as far as the pool's counts and logs care."""

    ASKED = "asked"        # it was being ended: asked, timed out, stopped or terminated
    AT_START = "at start"  # it died before it was ready: a failed start
    IDLE = "idle"          # it died with nothing sent to it
    RUNNING = "running"    # it died with tasks sent to it


@value_type(frozen=True)
class WorkerGone:
    """The slot's worker has exited (first of the actions its exit causes)."""
    index: int
    departure: Departure
    exited: Any = _payload()


@value_type(frozen=True)
class Broken:
    """Workers failed to start too often in a row: the pool starts no more."""


@value_type(frozen=True)
class Unreaped:
    """The slot's process survived SIGKILL's grace period: report it by pid."""
    index: int


Action = Union[Spawn, Send, Resolve, Fail, Stopped, Cancel, Reclaim, AskToExit, Signal,
               DumpStack, Misbehaved, WorkerGone, Broken, Unreaped]



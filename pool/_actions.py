"""The actions the state machine asks the dispatcher to carry out.

Owns: nothing but these value types. Runs in: the dispatcher thread.
Guarantees: each is immutable and names its slot or task by index or id, never by object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, slots=True)
class Spawn:
    slot: int


@dataclass(frozen=True, slots=True)
class Send:
    slot: int
    task_id: int


@dataclass(frozen=True, slots=True)
class Resolve:
    """The task's reply is final: deliver it to the future."""
    task_id: int


@dataclass(frozen=True, slots=True)
class FailDied:
    """The task's worker died while running it."""
    task_id: int
    slot: int


@dataclass(frozen=True, slots=True)
class FailMisbehaved:
    """The task's worker sent bytes that are not a reply."""
    task_id: int
    slot: int


@dataclass(frozen=True, slots=True)
class FailTimedOut:
    """The task overran its timeout; its worker was asked for its stack, then ended."""
    task_id: int
    slot: int
    timeout: float


@dataclass(frozen=True, slots=True)
class FailTerminated:
    """The task was running when terminate_workers() or kill_workers() ended its worker."""
    task_id: int
    slot: int


@dataclass(frozen=True, slots=True)
class Stopped:
    """The caller stopped this task: it never started, or (``ran``) its worker was killed."""
    task_id: int
    ran: bool = False


@dataclass(frozen=True, slots=True)
class FailBroken:
    """The pool stopped starting workers; this queued task cannot run."""
    task_id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """shutdown(cancel_futures=True) cancels this queued task."""
    task_id: int


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Take back the tasks that wait in the slot's pipe behind its running one (the
    dispatcher reports which it got with ``tasks_reclaimed``)."""
    slot: int


@dataclass(frozen=True, slots=True)
class AskToExit:
    """Ask the slot's worker to exit (close its task pipe)."""
    slot: int


@dataclass(frozen=True, slots=True)
class Signal:
    """Send a signal to the slot's worker and to its process group."""
    slot: int
    signum: int


@dataclass(frozen=True, slots=True)
class DumpStack:
    """Ask the slot's worker (not its group) to write its Python stack, then exit."""
    slot: int


@dataclass(frozen=True, slots=True)
class Broken:
    """Workers failed to start too often in a row: the pool starts no more."""


@dataclass(frozen=True, slots=True)
class Unreaped:
    """The slot's process survived SIGKILL's grace period: report it by pid."""
    slot: int


Action = Union[Spawn, Send, Resolve, FailDied, FailMisbehaved, FailTimedOut, FailTerminated,
               Stopped, FailBroken, Cancel, Reclaim, AskToExit, Signal, DumpStack, Broken, Unreaped]



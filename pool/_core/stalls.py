"""Workers that do not read what they were sent: stopped by SIGSTOP, a debugger or a
cgroup freezer.

Owns: when to check that a worker began to read its task, and how long a worker that did
not is left out.
Runs in: the dispatcher thread, inside ``StateMachine``.
Guarantees: a one-packet task whose worker has not begun to read it
``UNREAD_AFTER_SECONDS`` after it started is checked once per run (a ``Reclaim``); if it
comes back unread, it runs elsewhere and its worker is sent nothing for a while:
``STALL_FIRST_SECONDS`` the first time, twice as long each time in a row, up to
``STALL_MAX_SECONDS``. A reply from that worker ends the streak.
Assumes: only a pipe with packets, ``WorkerLife.pipelining``, can give a frame back, and
only a one-packet frame, ``Task.pipelinable``, comes back whole.
"""

from __future__ import annotations

from .backoff import doubling
from .states import Slot, Task

UNREAD_AFTER_SECONDS = 1.0
STALL_FIRST_SECONDS = 1.0
STALL_MAX_SECONDS = 30.0


def unread_deadline(slot: Slot, head: Task) -> float | None:
    """When to check that the slot's worker began to read ``head``, the task it runs;
    None if that was done, or cannot be."""
    if slot.worker.pipelining and head.pipelinable and not head.read_checked and (
            head.started is not None):
        return head.started + UNREAD_AFTER_SECONDS
    return None


def stalled(slot: Slot, now: float) -> bool:
    """The slot's worker did not read what it was sent, and its wait is not over."""
    stalled_until = slot.worker.stalled_until
    return stalled_until is not None and stalled_until > now


def stall(slot: Slot, now: float) -> None:
    """The slot's worker did not read the task it runs: send it nothing for a while."""
    worker = slot.worker
    worker.stalls += 1
    worker.stalled_until = now + doubling(STALL_FIRST_SECONDS, worker.stalls,
                                          STALL_MAX_SECONDS)

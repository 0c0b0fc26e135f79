"""Every deadline the machine keeps, listed in one place for the wait and for ``tick``.

Owns: the kinds of deadline (``Deadline``), the one listing of when each is due
(``Deadlines.listed``), and what happens when each fires (``FIRING``).
Runs in: the dispatcher thread, inside ``StateMachine``: ``earliest`` on every turn of the
loop, to know how long it may wait; ``fire_due`` when that time has come.
Guarantees: the wait and ``tick`` read the same listing, so no deadline can be waited for
and never fired, or fired and never waited for; every kind has a firing rule, checked at
import. Deadlines fire in the order listed: the pool's, then every slot's reclaim, then
every running task's, then every slot's own. A deadline that firing moves, such as the
next escalation step, is read after that firing. The listing is cheap, as the wait reads
it on every turn: it allocates nothing for a slot with no deadline.
Assumes: firing a deadline adds or removes no slot, so the listing may go on meanwhile.
"""

from __future__ import annotations

import enum
from typing import Callable, Iterator

from .actions import Action, Reclaim
from .escalation import Escalator
from .placement import reclaim_deadline
from .records import Records
from .stalls import unread_deadline
from .staffing import Staffing
from .start_failures import StartFailures
from .states import WORKING, Slot


class Deadline(enum.Enum):
    START_RETRY = "start retry"    # the wait after a refused start is over
    RECLAIM = "reclaim"            # a task ran long: take back the tasks behind it
    UNREAD = "unread"              # check that a worker began to read its task
    TASK_TIMEOUT = "task timeout"  # a running task overran its timeout
    STALL_OVER = "stall over"      # a worker that did not read may be sent tasks again
    IDLE = "idle"                  # a worker idled for idle_timeout: stop it
    ESCALATION = "escalation"      # a stopping worker's grace ran out: the next step


class Deadlines:
    __slots__ = ("_records", "_starts", "_escalator", "_staffing")

    def __init__(self, records: Records, starts: StartFailures, escalator: Escalator,
                 staffing: Staffing) -> None:
        self._records = records
        self._starts = starts
        self._escalator = escalator
        self._staffing = staffing

    def listed(self) -> Iterator[tuple[float, Deadline, Slot | None]]:
        """Every deadline, as ``(when, kind, slot)``, ``slot`` None for the pool's own. Each
        is read as it is reached, so that one fired before it has its effect."""
        retry_at = self._starts.retry_at
        if retry_at is not None:
            yield retry_at, Deadline.START_RETRY, None
        slots, tasks = self._records.slots, self._records.tasks
        # The tasks waiting behind long ones are taken back first, on every slot.
        for slot in slots:
            if len(slot.in_flight) > 1 and slot.state in WORKING:
                when = reclaim_deadline(slot, tasks[slot.in_flight[0]])
                if when is not None:
                    yield when, Deadline.RECLAIM, slot
        for slot in slots:
            if slot.in_flight and slot.state in WORKING:
                head = tasks[slot.in_flight[0]]
                when = unread_deadline(slot, head)
                if when is not None:
                    yield when, Deadline.UNREAD, slot
                if head.deadline is not None:
                    yield head.deadline, Deadline.TASK_TIMEOUT, slot
        staffing = self._staffing
        idle_timeout = staffing.idle_timeout
        for slot in slots:
            if slot.worker.stalled_until is not None:
                yield slot.worker.stalled_until, Deadline.STALL_OVER, slot
            if idle_timeout is not None:
                when = staffing.idle_deadline(slot)
                if when is not None:
                    yield when, Deadline.IDLE, slot
            stopping = slot.stopping
            if stopping is not None and stopping.deadline is not None:
                yield stopping.deadline, Deadline.ESCALATION, slot

    def earliest(self) -> float | None:
        """The earliest deadline, or None if there is none."""
        earliest = None
        for when, _, _ in self.listed():
            if earliest is None or when < earliest:
                earliest = when
        return earliest

    def fire_due(self, now: float) -> tuple[list[Action], bool]:
        """Fire every deadline that has passed. Returns their actions, and whether the
        machine is to schedule once they all fired."""
        actions: list[Action] = []
        schedule = False
        for when, kind, slot in self.listed():
            if when <= now:
                fire, then_schedule = FIRING[kind]
                actions += fire(self, slot)
                schedule = schedule or then_schedule
        return actions, schedule

    # -- what each kind does when it fires ---------------------------------------------

    def _retry_start(self, _: Slot | None) -> list[Action]:
        self._starts.retry_due()
        return self._staffing.spawn()

    def _reclaim(self, slot: Slot | None) -> list[Action]:
        """Take back the tasks behind the running one, once per run."""
        assert slot is not None
        self._records.tasks[slot.in_flight[0]].kept_alone = True
        return [Reclaim(slot.index)]

    def _check_read(self, slot: Slot | None) -> list[Action]:
        """Has the worker begun to read its task? A Reclaim takes it back if not."""
        assert slot is not None
        self._records.tasks[slot.in_flight[0]].read_checked = True
        slot.worker.checking_read = True
        return [Reclaim(slot.index)]

    def _time_out(self, slot: Slot | None) -> list[Action]:
        assert slot is not None
        self._records.tasks[slot.in_flight[0]].deadline = None
        return self._escalator.time_out(slot)

    def _end_stall(self, slot: Slot | None) -> list[Action]:
        """It may be sent tasks again, and checked again."""
        assert slot is not None
        slot.worker.stalled_until = None
        return []

    def _stop_idle(self, slot: Slot | None) -> list[Action]:
        assert slot is not None
        return self._staffing.stop_idle(slot)

    def _next_step(self, slot: Slot | None) -> list[Action]:
        assert slot is not None
        return self._escalator.next_step(slot)


# Each kind: what it does when it fires, and whether the machine schedules after it.
FIRING: dict[Deadline, tuple[Callable[[Deadlines, Slot | None], list[Action]], bool]] = {
    Deadline.START_RETRY: (Deadlines._retry_start, False),
    Deadline.RECLAIM: (Deadlines._reclaim, False),
    Deadline.UNREAD: (Deadlines._check_read, False),
    Deadline.TASK_TIMEOUT: (Deadlines._time_out, False),
    Deadline.STALL_OVER: (Deadlines._end_stall, True),  # a worker is free to take tasks
    Deadline.IDLE: (Deadlines._stop_idle, False),
    Deadline.ESCALATION: (Deadlines._next_step, False),
}

assert set(FIRING) == set(Deadline), "a kind of deadline with no firing rule"

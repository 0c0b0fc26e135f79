"""Every deadline, listed once for the wait and for ``tick`` (``pool._core.deadlines``),
with a fake clock: each kind is waited for at the time it fires, and fires then."""

from __future__ import annotations

import signal

from pool._core.actions import AskToExit, DumpStack, Reclaim, Signal, Spawn
from pool._core.deadlines import FIRING, Deadline, Deadlines
from pool._core.escalation import Escalator
from pool._core.placement import RECLAIM_AFTER_SECONDS
from pool._core.records import Records
from pool._core.staffing import Staffing
from pool._core.stalls import STALL_FIRST_SECONDS, UNREAD_AFTER_SECONDS, stall
from pool._core.start_failures import START_RETRY_FIRST_SECONDS, StartFailures
from pool._core.states import Ending, Escalation, SlotState, Task, TaskState, Timeouts
from core_parts import FakeClock

TIMEOUTS = Timeouts(stop=3.0, terminate=0.5, kill=5.0, dump=1.0)


class Parts:
    def __init__(self, workers: int = 2, idle_timeout: float | None = None,
                 timeouts: Timeouts = TIMEOUTS) -> None:
        self.clock = FakeClock()
        self.records = Records(workers, self.clock)
        self.starts = StartFailures()
        self.escalator = Escalator(self.records, timeouts)
        self.staffing = Staffing(self.records, self.starts, self.escalator, idle_timeout)
        self.deadlines = Deadlines(self.records, self.starts, self.escalator, self.staffing)

    def ready(self, index: int, pipelining: bool = False) -> None:
        slot = self.records.slots[index]
        self.records.move_slot(slot, SlotState.STARTING)
        slot.worker.pipelining = pipelining
        self.records.move_slot(slot, SlotState.READY)

    def run(self, index: int, *task_ids: int, timeout: float | None = None,
            frame_bytes: int = 10_000) -> None:
        """Send these tasks to the slot: the first runs, from now."""
        slot = self.records.slots[index]
        for task_id in task_ids:
            task = self.records.tasks[task_id] = Task(task_id, frame_bytes, frame_bytes <= 100,
                                                      timeout)
            if not slot.in_flight:
                self.records.move_task(task, TaskState.RUNNING)
                task.started = self.clock.now
                if timeout is not None:
                    task.deadline = self.clock.now + timeout
            else:
                self.records.move_task(task, TaskState.ASSIGNED)
            slot.in_flight.append(task_id)

    def listed(self) -> list[tuple[float, Deadline, int | None]]:
        return [(when, kind, None if slot is None else slot.index)
                for when, kind, slot in self.deadlines.listed()]

    def fires_at(self, when: float) -> tuple[list, bool]:
        """Nothing fires just before ``when``, which is the earliest deadline; at ``when``,
        what fired."""
        assert self.deadlines.earliest() == when
        self.clock.now = when - 1e-6
        assert self.deadlines.fire_due(self.clock.now) == ([], False)
        self.clock.now = when
        return self.deadlines.fire_due(when)


def test_every_kind_of_deadline_has_a_firing_rule():
    assert set(FIRING) == set(Deadline)


def test_a_pool_with_nothing_to_wait_for_lists_no_deadline():
    parts = Parts(64)
    for index in range(0, 64, 2):
        parts.ready(index)
    assert parts.listed() == [] and parts.deadlines.earliest() is None


def test_a_refused_start_is_tried_again_when_its_wait_is_over():
    parts = Parts(1)
    parts.records.tasks[1] = Task(1, 100, True)
    parts.records.queue.append(1)
    parts.starts.start_refused(parts.clock.now)
    when = parts.clock.now + START_RETRY_FIRST_SECONDS
    assert parts.listed() == [(when, Deadline.START_RETRY, None)]
    assert parts.fires_at(when) == ([Spawn(0)], False)
    assert parts.starts.retry_at is None and parts.listed() == []


def test_the_tasks_behind_a_long_one_are_taken_back_once():
    parts = Parts(1)
    parts.ready(0)
    parts.run(0, 1, 2)
    when = parts.clock.now + RECLAIM_AFTER_SECONDS
    assert parts.listed() == [(when, Deadline.RECLAIM, 0)]
    assert parts.fires_at(when) == ([Reclaim(0)], False)
    assert parts.records.tasks[1].kept_alone and parts.listed() == []


def test_a_worker_is_checked_once_for_reading_its_task():
    parts = Parts(1)
    parts.ready(0, pipelining=True)
    parts.run(0, 1, frame_bytes=100)
    when = parts.clock.now + UNREAD_AFTER_SECONDS
    assert parts.listed() == [(when, Deadline.UNREAD, 0)]
    assert parts.fires_at(when) == ([Reclaim(0)], False)
    assert parts.records.slots[0].worker.checking_read and parts.listed() == []


def test_a_task_that_overruns_its_timeout_has_its_worker_dump_its_stack_then_killed():
    parts = Parts(1)
    parts.ready(0)
    parts.run(0, 1, timeout=2.0)
    when = parts.clock.now + 2.0
    assert parts.listed() == [(when, Deadline.TASK_TIMEOUT, 0)]
    assert parts.fires_at(when) == ([DumpStack(0)], False)
    stopping = parts.records.slots[0].stopping
    assert stopping is not None and stopping.ending is Ending.TIMED_OUT
    assert parts.listed() == [(when + 1.0, Deadline.ESCALATION, 0)]  # the dump's grace
    assert parts.fires_at(when + 1.0) == ([Signal(0, signal.SIGKILL)], False)


def test_a_stalled_worker_may_take_tasks_again_and_the_machine_schedules_then():
    parts = Parts(1)
    parts.ready(0)
    stall(parts.records.slots[0], parts.clock.now)
    when = parts.clock.now + STALL_FIRST_SECONDS
    assert parts.listed() == [(when, Deadline.STALL_OVER, 0)]
    assert parts.fires_at(when) == ([], True)
    assert parts.listed() == []


def test_a_worker_idle_for_idle_timeout_is_asked_to_stop_then_escalated():
    parts = Parts(1, idle_timeout=10.0)
    parts.ready(0)
    when = parts.clock.now + 10.0
    assert parts.listed() == [(when, Deadline.IDLE, 0)]
    assert parts.fires_at(when) == ([AskToExit(0)], False)
    assert parts.records.slots[0].idled_out
    assert parts.listed() == [(when + 3.0, Deadline.ESCALATION, 0)]
    assert parts.fires_at(when + 3.0) == ([Signal(0, signal.SIGTERM)], False)


def test_reclaims_fire_first_on_every_slot_then_running_tasks_then_each_slots_own():
    parts = Parts(3, idle_timeout=1.0)
    parts.ready(0)
    parts.run(0, 1, timeout=RECLAIM_AFTER_SECONDS)
    parts.ready(1)
    parts.run(1, 2, 3)
    parts.ready(2)  # idle: stopped after 1 s
    parts.clock.now += 1.0
    actions, schedule = parts.deadlines.fire_due(parts.clock.now)
    assert actions == [Reclaim(1), DumpStack(0), AskToExit(2)] and not schedule


def test_a_deadline_that_firing_moves_is_read_after_it_moved():
    parts = Parts(1, timeouts=Timeouts(dump=0.0))  # no grace for the stack dump
    parts.ready(0)
    parts.run(0, 1, timeout=1.0)
    parts.clock.now += 1.0
    assert parts.deadlines.fire_due(parts.clock.now) == (
        [DumpStack(0), Signal(0, signal.SIGKILL)], False)
    stopping = parts.records.slots[0].stopping
    assert stopping is not None and stopping.escalation is Escalation.KILLED

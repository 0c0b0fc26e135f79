"""Which worker runs which task, pipelining, taking tasks back, and workers that do not
read (``pool._core.placement``, ``pool._core.stalls``), with a fake clock."""

from __future__ import annotations

import signal

import pytest

from pool._core.actions import Fail, FailCause, Send, Signal, Stopped
from pool._core.escalation import Escalator
from pool._core.placement import (RECLAIM_AFTER_SECONDS, SHORT_TASK_SECONDS, Placement,
                                  reclaim_deadline)
from pool._core.records import Records
from pool._core.stalls import (STALL_FIRST_SECONDS, UNREAD_AFTER_SECONDS, stall, stalled,
                               unread_deadline)
from pool._core.states import (InvalidTransition, PoolLife, SlotState, Task, TaskState,
                               Timeouts)
from core_parts import FakeClock

SMALL, LARGE = 100, 10_000


def placement(workers: int = 2, *, depth: int = 3, max_tasks: int | None = None,
              ready: tuple[int, ...] = (0, 1), warm: bool = True
              ) -> tuple[Placement, Records, FakeClock]:
    """A placement over READY workers on pipes that can give frames back; ``warm``: their
    last task was short, so small tasks may wait behind a running one."""
    clock = FakeClock()
    records = Records(workers, clock)
    for index in ready:
        slot = records.slots[index]
        records.move_slot(slot, SlotState.STARTING)
        slot.worker.pipelining = True
        slot.worker.last_duration = 0.0 if warm else None
        records.move_slot(slot, SlotState.READY)
    return (Placement(records, Escalator(records, Timeouts()), depth=depth,
                      ahead_max_frame=SMALL, max_tasks_per_child=max_tasks), records, clock)


def submit(records: Records, *task_ids: int, frame_bytes: int = SMALL,
           timeout: float | None = None) -> None:
    for task_id in task_ids:
        records.tasks[task_id] = Task(task_id, frame_bytes, frame_bytes <= SMALL, timeout)
        records.queue.append(task_id)


def test_an_idle_worker_comes_first_then_small_tasks_wait_behind_running_ones():
    p, records, _ = placement()
    submit(records, 1, 2, 3, 4)
    assert p.assign() == [Send(0, 1), Send(1, 2), Send(0, 3), Send(1, 4)]
    assert [records.tasks[t].state for t in (1, 2, 3, 4)] == [
        TaskState.RUNNING, TaskState.RUNNING, TaskState.ASSIGNED, TaskState.ASSIGNED]


def test_a_task_waits_behind_another_only_within_every_pipelining_rule():
    def sent_ahead(frame_bytes: int = SMALL, head_bytes: int = SMALL, depth: int = 3,
                   warm: bool = True, last: float = 0.0, ran: float = 0.0,
                   kept_alone: bool = False) -> bool:
        p, records, clock = placement(1, depth=depth, ready=(0,), warm=warm)
        if warm:
            records.slots[0].worker.last_duration = last
        submit(records, 1, frame_bytes=head_bytes)
        p.assign()
        records.tasks[1].kept_alone = kept_alone
        clock.now += ran
        submit(records, 2, frame_bytes=frame_bytes)
        return p.assign() == [Send(0, 2)]
    assert sent_ahead()
    assert not sent_ahead(frame_bytes=LARGE)   # more than a packet: it could not come back
    assert not sent_ahead(head_bytes=LARGE)    # nor behind a task that could not
    assert not sent_ahead(depth=1)             # no room in the pipeline
    assert not sent_ahead(warm=False)          # nothing known of the worker's tasks yet
    assert not sent_ahead(last=SHORT_TASK_SECONDS)     # its last task was not short
    assert not sent_ahead(ran=2 * RECLAIM_AFTER_SECONDS)  # the running one runs long
    assert not sent_ahead(kept_alone=True)     # the tasks behind it were taken back


def test_a_stalled_worker_is_given_nothing_until_its_wait_is_over():
    p, records, clock = placement(1, ready=(0,))
    stall(records.slots[0], clock.now)
    assert stalled(records.slots[0], clock.now)
    submit(records, 1)
    assert p.assign() == []
    clock.now += STALL_FIRST_SECONDS
    assert not stalled(records.slots[0], clock.now)
    assert p.assign() == [Send(0, 1)]


def test_a_used_quota_retires_the_worker_and_a_task_taken_back_gives_it_back():
    p, records, _ = placement(1, max_tasks=2, ready=(0,))
    submit(records, 1, 2, 3)
    assert p.assign() == [Send(0, 1), Send(0, 2)]
    slot = records.slots[0]
    assert slot.state is SlotState.RETIRING and p.quota_used(slot)
    assert p.withdraw(slot, 2) == []
    p.reopen_if_quota_left(slot)
    assert slot.state is SlotState.READY
    slot.worker.over_memory = True
    assert p.assign() == [Send(0, 3)]
    assert slot.state is SlotState.RETIRING
    p.withdraw(slot, 3)
    p.reopen_if_quota_left(slot)
    assert slot.state is SlotState.RETIRING  # it retires for its memory anyway


def test_withdrawing_the_running_task_starts_the_next_ones_clock():
    p, records, clock = placement(1, ready=(0,))
    submit(records, 1, 2, timeout=5.0)
    p.assign()
    clock.now += 0.5
    assert p.withdraw(records.slots[0], 1) == []
    assert records.tasks[2].state is TaskState.RUNNING
    assert records.tasks[2].deadline == clock.now + 5.0
    with pytest.raises(InvalidTransition, match="not sent to slot 0"):
        p.withdraw(records.slots[0], 1)


def test_a_task_stopped_before_it_started_ends_its_worker_when_it_does():
    p, records, _ = placement(1, ready=(0,))
    submit(records, 1, 2)
    p.assign()
    records.tasks[2].stop_requested = True
    assert p.withdraw(records.slots[0], 1) == [Signal(0, signal.SIGKILL)]


def test_tasks_that_never_started_go_back_to_the_front_in_order_or_end_if_stopped():
    p, records, _ = placement(1, ready=(0,))
    submit(records, 1, 2, 3, 4)
    p.assign()  # 1 runs, 2 and 3 wait behind it
    records.tasks[3].stop_requested = True
    records.tasks[1].kept_alone = records.tasks[1].read_checked = True
    assert p.requeue_in_flight(records.slots[0]) == [Stopped(3)]
    assert list(records.queue) == [1, 2, 4]
    assert not records.tasks[1].kept_alone and not records.tasks[1].read_checked
    records.move_life(PoolLife.TERMINATING)
    records.queue.popleft()
    records.move_task(records.tasks[1], TaskState.RUNNING)
    assert p.requeue([1]) == [Stopped(1)]


def test_tasks_taken_back_leave_what_the_worker_read_in_flight_in_order():
    p, records, _ = placement(1, ready=(0,), depth=4)
    submit(records, 1, 2, 3, 4)
    p.assign()
    slot = records.slots[0]
    assert p.taken_back(slot, [1, 3], checking_read=False) == []
    assert list(slot.in_flight) == [2, 4] and list(records.queue) == [1, 3]
    assert records.tasks[2].state is TaskState.RUNNING and slot.worker.stalls == 0
    assert p.assign() == [Send(0, 1), Send(0, 3)]  # 2 just started: they may wait behind it
    with pytest.raises(InvalidTransition, match="gave back"):
        p.taken_back(slot, [3, 1], checking_read=False)


def test_a_running_task_taken_back_unread_when_checked_stalls_its_worker():
    p, records, clock = placement(1, ready=(0,))
    submit(records, 1)
    p.assign()
    slot = records.slots[0]
    assert p.taken_back(slot, [1], checking_read=True) == []
    assert slot.worker.stalls == 1
    assert slot.worker.stalled_until == clock.now + STALL_FIRST_SECONDS
    assert slot.worker.idle_since == clock.now and list(records.queue) == [1]


def test_a_gone_workers_tasks_wholly_unread_never_started():
    for unread, ends, queue in ((0, [Fail(1, FailCause.DIED, 0)], [2, 3]),
                                (SMALL, [Fail(1, FailCause.DIED, 0)], [2, 3]),
                                (2 * SMALL + SMALL // 2, [Fail(1, FailCause.DIED, 0)], [2, 3]),
                                (3 * SMALL, [], [1, 2, 3])):
        p, records, _ = placement(1, ready=(0,))
        submit(records, 1, 2, 3)
        p.assign()
        assert p.worker_gone(records.slots[0], unread, exited=None) == ends, unread
        assert list(records.queue) == queue and not records.slots[0].in_flight


def test_when_the_tasks_behind_a_running_one_are_taken_back_and_its_read_checked():
    p, records, clock = placement(1, ready=(0,))
    submit(records, 1, 2)
    p.assign()
    slot, head = records.slots[0], records.tasks[1]
    assert reclaim_deadline(slot, head) == clock.now + RECLAIM_AFTER_SECONDS
    assert unread_deadline(slot, head) == clock.now + UNREAD_AFTER_SECONDS
    head.kept_alone = head.read_checked = True  # each is done once per run
    assert reclaim_deadline(slot, head) is None and unread_deadline(slot, head) is None
    head.read_checked = False
    slot.worker.pipelining = False  # a pipe without packets gives nothing back
    assert unread_deadline(slot, head) is None
    slot.in_flight.pop()
    head.kept_alone = False
    assert reclaim_deadline(slot, head) is None  # nothing behind it

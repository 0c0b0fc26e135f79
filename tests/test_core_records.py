"""The machine's records: the queue of waiting tasks, and the one place that moves a task,
a slot or the pool (``pool._core.records``)."""

from __future__ import annotations

import pytest

from pool._core.records import Records
from pool._core.states import (Escalation, InvalidTransition, PoolLife, SlotState, Stopping,
                               Task, TaskState, WorkerLife)
from core_parts import FakeClock


def records(workers: int = 2) -> tuple[Records, FakeClock]:
    clock = FakeClock()
    return Records(workers, clock), clock


def queued(r: Records, *task_ids: int) -> None:
    for task_id in task_ids:
        r.tasks[task_id] = Task(task_id, 100, True)
        r.queue.append(task_id)


def test_the_queue_keeps_order_and_takes_tasks_back_to_the_front():
    r, _ = records()
    queued(r, 1, 2, 3)
    assert list(r.queue) == [1, 2, 3] and len(r.queue) == 3
    assert r.queue.popleft() == 1
    r.queue.appendleft(1)
    assert r.queue.peek() == 1
    r.queue.drop_head()
    assert list(r.queue) == [2, 3]


def test_a_task_that_ends_in_the_queue_is_forgotten_where_it_stands():
    r, _ = records()
    queued(r, 1, 2, 3, 4)
    for task_id in (3, 1):
        r.move_task(r.tasks[task_id], TaskState.CANCELLED)
        r.queue.forget_ended()
    assert list(r.queue) == [2, 4] and len(r.queue) == 2 and r.queue
    assert r.queue.peek() == 2  # the ended head was dropped on the way
    assert r.queue.popleft() == 2 and r.queue.popleft() == 4
    assert not r.queue and len(r.queue) == 0 and r.queue.peek() is None


def test_a_task_moves_only_as_its_table_allows_and_leaves_the_records_when_it_ends():
    r, clock = records()
    queued(r, 1)
    task = r.tasks[1]
    with pytest.raises(InvalidTransition, match="task 1: QUEUED -> DONE"):
        r.move_task(task, TaskState.DONE)
    r.move_task(task, TaskState.RUNNING)
    task.deadline = clock.now + 1
    r.move_task(task, TaskState.QUEUED)  # never started after all: its clock goes
    assert task.deadline is None and 1 in r.tasks
    r.move_task(task, TaskState.RUNNING)
    r.move_task(task, TaskState.DONE)
    assert 1 not in r.tasks


def test_a_slot_moves_only_as_its_table_allows_and_is_counted_by_state():
    r, _ = records(3)
    slot = r.slots[1]
    with pytest.raises(InvalidTransition, match="slot 1: UNUSED -> READY"):
        r.move_slot(slot, SlotState.READY)
    r.move_slot(slot, SlotState.STARTING)
    assert r.in_state[SlotState.UNUSED] == 2 and r.in_state[SlotState.STARTING] == 1
    assert all(r.in_state[state] == 0 for state in SlotState
               if state not in (SlotState.UNUSED, SlotState.STARTING))


def test_a_slot_that_empties_forgets_its_worker_and_its_ending():
    r, clock = records()
    slot = r.slots[0]
    r.move_slot(slot, SlotState.STARTING)
    r.move_slot(slot, SlotState.READY)
    assert slot.worker.idle_since == clock.now  # ready with nothing to do: idle from now
    worker = slot.worker
    worker.assigned_count, worker.stalls, worker.last_duration = 5, 2, 0.5
    r.move_slot(slot, SlotState.STOPPING)
    slot.stopping = Stopping(Escalation.ASKED, clock.now + 3)
    r.move_slot(slot, SlotState.EMPTY)
    assert slot.worker == WorkerLife() and slot.worker is not worker
    assert slot.stopping is None


def test_a_slot_that_starts_a_worker_again_may_be_refilled_at_once_again():
    r, _ = records()
    slot = r.slots[0]
    r.move_slot(slot, SlotState.STARTING)
    r.move_slot(slot, SlotState.EMPTY)
    slot.idled_out = True  # its worker was stopped for idling
    r.move_slot(slot, SlotState.STARTING)
    assert not slot.idled_out


def test_the_pool_moves_only_as_its_table_allows():
    r, _ = records()
    r.move_life(PoolLife.DRAINING)
    with pytest.raises(InvalidTransition, match="pool: DRAINING -> OPEN"):
        r.move_life(PoolLife.OPEN)
    r.move_life(PoolLife.CLOSED)
    assert r.life is PoolLife.CLOSED

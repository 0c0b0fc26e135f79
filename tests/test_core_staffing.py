"""Which slots get a worker and which workers are let go (``pool._core.staffing``), with a
fake clock."""

from __future__ import annotations

from core_parts import Parts
from pool._core.actions import AskToExit, Spawn
from pool._core.stalls import stall
from pool._core.states import PoolLife, SlotState

def test_workers_start_on_demand_while_queued_tasks_outnumber_places_to_run_them():
    parts = Parts(3)
    assert parts.staffing.spawn() == []  # nothing queued: nothing starts
    parts.queue(1, 2)
    assert parts.staffing.spawn() == [Spawn(0), Spawn(1)]
    assert parts.staffing.spawn() == []  # two places starting for two tasks


def test_an_emptied_slot_is_refilled_at_once_unless_its_worker_idled_out():
    parts = Parts(2)
    parts.ready(0, 1)
    parts.empty(0, 1)
    parts.records.slots[1].idled_out = True
    assert parts.staffing.spawn() == [Spawn(0)]
    parts.queue(1, 2)
    assert parts.staffing.spawn() == [Spawn(1)]  # work needs it: then it starts


def test_a_stalled_worker_is_no_place_to_run_a_task():
    parts = Parts(2)
    parts.ready(0)
    parts.queue(1)
    assert parts.staffing.spawn() == []
    stall(parts.records.slots[0], parts.clock.now)
    assert parts.staffing.spawn() == [Spawn(1)]


def test_after_a_refused_start_nothing_starts_before_the_retry_then_one_at_a_time():
    parts = Parts(3)
    parts.queue(1, 2, 3)
    parts.starts.start_refused(parts.clock.now)
    assert parts.staffing.spawn() == []
    parts.starts.retry_due()
    assert parts.staffing.spawn() == [Spawn(0)]
    assert parts.staffing.spawn() == []  # while that probe starts
    parts.starts.worker_ready()
    assert parts.staffing.spawn() == [Spawn(1), Spawn(2)]


def test_an_ending_pool_refills_nothing_and_a_draining_one_starts_for_its_queue():
    parts = Parts(2)
    parts.ready(0)
    parts.empty(0)
    parts.lifecycle.shutdown(cancel_futures=False)
    assert parts.staffing.spawn() == []
    parts.queue(1)
    assert parts.staffing.spawn() == [Spawn(0)]
    parts.records.move_life(PoolLife.TERMINATING)
    parts.queue(2)
    assert parts.staffing.spawn() == []


def test_idle_retired_and_unneeded_workers_are_let_go():
    parts = Parts(3)
    parts.ready(0, 1)
    parts.records.move_slot(parts.records.slots[0], SlotState.RETIRING)
    parts.records.move_slot(parts.records.slots[2], SlotState.STARTING)
    assert parts.staffing.stop_unneeded() == [AskToExit(0)]  # open: only the retired one
    parts.lifecycle.shutdown(cancel_futures=False)
    assert parts.staffing.stop_unneeded() == [AskToExit(1), AskToExit(2)]


def test_a_worker_idle_for_idle_timeout_is_stopped_and_marked_so():
    parts = Parts(1, idle_timeout=10.0)
    parts.ready(0)
    slot = parts.records.slots[0]
    assert parts.staffing.idle_deadline(slot) == parts.clock.now + 10.0
    slot.in_flight.append(1)
    assert parts.staffing.idle_deadline(slot) is None  # busy
    slot.in_flight.clear()
    assert parts.staffing.stop_idle(slot) == [AskToExit(0)]
    assert slot.idled_out and parts.staffing.idle_deadline(slot) is None
    assert Parts(1).staffing.idle_deadline(Parts(1).records.slots[0]) is None

"""Ending a worker: the escalation table and the part that walks it
(``pool._core.escalation``), with a fake clock and no processes."""

from __future__ import annotations

import signal

from pool._core.actions import AskToExit, DumpStack, Fail, FailCause, Signal, Stopped, Unreaped
from pool._core.escalation import STEPS, Escalator
from pool._core.records import Records
from pool._core.states import Ending, Escalation, SlotState, Task, TaskState, Timeouts
from core_parts import FakeClock

TIMEOUTS = Timeouts(stop=3.0, terminate=0.5, kill=5.0, dump=1.0)


def escalator() -> tuple[Escalator, Records, FakeClock]:
    clock = FakeClock()
    records = Records(1, clock)
    slot = records.slots[0]
    records.move_slot(slot, SlotState.STARTING)
    records.move_slot(slot, SlotState.READY)
    return Escalator(records, TIMEOUTS), records, clock


def running(records: Records, task_id: int = 1, timeout: float | None = None) -> Task:
    task = records.tasks[task_id] = Task(task_id, 100, True, timeout)
    records.move_task(task, TaskState.RUNNING)
    records.slots[0].in_flight.append(task_id)
    return task


def test_the_table_has_a_row_per_step_and_each_leads_harder_to_giving_up():
    assert set(STEPS) == set(Escalation)
    for first in (Escalation.ASKED, Escalation.DUMPING):
        path, step = [first], STEPS[first].then
        while step is not None:
            assert STEPS[step].hardness > STEPS[path[-1]].hardness
            path.append(step)
            step = STEPS[step].then
        assert path[-1] is Escalation.GIVEN_UP
    assert [STEPS[step].grace(TIMEOUTS) for step in  # type: ignore[misc]
            (Escalation.ASKED, Escalation.DUMPING, Escalation.TERMINATED, Escalation.KILLED)
            ] == [3.0, 1.0, 0.5, 5.0]
    assert STEPS[Escalation.GIVEN_UP].grace is None


def test_asking_an_idle_worker_to_stop_escalates_step_by_step_when_it_does_not():
    e, records, clock = escalator()
    slot = records.slots[0]
    assert e.ask_to_stop(slot) == [AskToExit(0)]
    assert slot.state is SlotState.STOPPING and slot.stopping is not None
    assert slot.stopping.deadline == clock.now + 3.0
    seen = []
    while slot.stopping.deadline is not None:
        clock.now = slot.stopping.deadline
        seen += e.next_step(slot)
    assert seen == [Signal(0, signal.SIGTERM), Signal(0, signal.SIGKILL), Unreaped(0)]
    assert slot.stopping.escalation is Escalation.GIVEN_UP


def test_a_worker_is_never_taken_to_the_same_step_twice_nor_to_an_easier_one():
    e, records, _ = escalator()
    slot = records.slots[0]
    assert e.kill(slot) == [Signal(0, signal.SIGKILL)]
    assert slot.stopping is not None
    deadline = slot.stopping.deadline
    assert e.kill(slot) == [] and e.ask_to_stop(slot) == []
    assert e.terminate(slot, signal.SIGTERM) == []
    assert slot.stopping.escalation is Escalation.KILLED and slot.stopping.deadline == deadline


def test_terminate_goes_past_a_request_to_stop_but_not_past_a_stack_dump():
    e, records, _ = escalator()
    slot = records.slots[0]
    e.ask_to_stop(slot)
    assert e.terminate(slot, signal.SIGTERM) == [Signal(0, signal.SIGTERM)]
    e2, records2, _ = escalator()
    running(records2, timeout=1.0)
    assert e2.time_out(records2.slots[0]) == [DumpStack(0)]
    assert e2.terminate(records2.slots[0], signal.SIGTERM) == []  # killed after the dump
    assert e2.terminate(records2.slots[0], signal.SIGKILL) == [Signal(0, signal.SIGKILL)]


def test_how_a_gone_workers_running_task_ends_follows_why_it_was_ended():
    cases = [(None, Fail(1, FailCause.DIED, 0)),
             ("time_out", Fail(1, FailCause.TIMED_OUT, 0, 2.0)),
             ("stop_running", Stopped(1, ran=True)),
             ("terminate", Fail(1, FailCause.TERMINATED, 0))]
    for how, ends in cases:
        e, records, _ = escalator()
        slot = records.slots[0]
        running(records, timeout=2.0)
        if how == "terminate":
            e.terminate(slot, signal.SIGTERM)
        elif how is not None:
            getattr(e, how)(slot)
        assert e.end_running_task(slot, exited="exit") == ends, how
        assert 1 not in records.tasks and not slot.in_flight


def test_a_stop_after_the_timeout_fired_leaves_the_timeout_to_be_told():
    e, records, _ = escalator()
    slot = records.slots[0]
    running(records, timeout=2.0)
    e.time_out(slot)
    assert e.stop_running(slot) == []
    assert slot.stopping is not None and slot.stopping.ending is Ending.TIMED_OUT


def test_terminating_an_idle_worker_gives_it_no_task_to_fail():
    e, records, _ = escalator()
    slot = records.slots[0]
    assert e.terminate(slot, signal.SIGKILL) == [Signal(0, signal.SIGKILL)]
    assert slot.stopping is not None and slot.stopping.ending is None


def test_a_reply_that_beats_the_end_wins_over_a_timeout_or_a_stop_not_a_terminate():
    for how, left in (("time_out", None), ("stop_running", None),
                      ("terminate", Ending.TERMINATED)):
        e, records, _ = escalator()
        slot = records.slots[0]
        running(records, timeout=2.0)
        if how == "terminate":
            e.terminate(slot, signal.SIGTERM)
        else:
            getattr(e, how)(slot)
        e.replied_while_ending(slot)
        assert slot.stopping is not None and slot.stopping.ending is left, how

"""The slot/task state machine, driven by events alone: no processes, a fake clock."""

from __future__ import annotations

import signal
from collections import deque

import pytest

from pool._core.actions import (AskToExit, Broken, Cancel, Departure, DumpStack, Fail,
                                FailCause, Misbehaved, Reclaim, Resolve, Send, Signal, Spawn,
                                Stopped, Unreaped, WorkerGone)
from pool._core.states import (Ending, Escalation, InvalidTransition, PoolLife, SlotState,
                               TaskState, Timeouts)
from pool._core.machine import StateMachine
from pool._core.placement import RECLAIM_AFTER_SECONDS
from pool._core.stalls import STALL_FIRST_SECONDS, STALL_MAX_SECONDS, UNREAD_AFTER_SECONDS
from pool._core.start_failures import (MAX_REFUSED_STARTS, MAX_START_FAILURES,
                                       START_RETRY_FIRST_SECONDS, START_RETRY_MAX_SECONDS)
from core_parts import FakeClock


def machine(workers: int = 2, **kwargs: object) -> tuple[StateMachine, FakeClock]:
    clock = FakeClock()
    return StateMachine(workers, clock, **kwargs), clock  # type: ignore[arg-type]


# CALL frame sizes: one that may be sent ahead (one packet), and one that may not.
SMALL, LARGE = 100, 10_000


def exited(m: StateMachine, slot: int, **kwargs: object) -> list:
    """``worker_exited``'s actions after the first, which always says how the worker left."""
    actions = m.worker_exited(slot, **kwargs)  # type: ignore[arg-type]
    assert isinstance(actions[0], WorkerGone) and actions[0].index == slot, actions
    return actions[1:]


def start(m: StateMachine, *slots: int, pipelining: bool = False) -> list:
    """Start workers (by default on pipes that cannot give frames back: no tasks are sent
    ahead to them, and no Reclaim checks that they read what they were sent)."""
    actions = []
    for slot in slots:
        actions += m.worker_ready(slot, pipelining=pipelining)
    return actions


def start_warm(m: StateMachine, *slots: int) -> list:
    """Start workers whose last task was short, on pipes that can give frames back, so that
    small tasks are pipelined to them."""
    for slot in slots:
        m.slots[slot].worker.last_duration = 0.0
    return start(m, *slots, pipelining=True)


def test_first_submit_spawns_one_worker_and_sends_when_ready():
    m, _ = machine(2)
    assert m.submit(1, frame_bytes=LARGE) == [Spawn(0)]
    assert m.slots[0].state is SlotState.STARTING
    assert m.worker_ready(0) == [Send(0, 1)]
    assert m.task_state(1) is TaskState.RUNNING


def test_workers_start_on_demand_up_to_max():
    m, _ = machine(2)
    assert m.submit(1, frame_bytes=LARGE) == [Spawn(0)]
    assert m.submit(2, frame_bytes=LARGE) == [Spawn(1)]
    assert m.submit(3, frame_bytes=LARGE) == []  # both slots starting; no third worker exists
    assert start(m, 0, 1) == [Send(0, 1), Send(1, 2)]
    assert m.queued == [3]


def test_reply_resolves_and_assigns_next():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2)]
    assert m.task_state(1) is None and m.task_state(2) is TaskState.RUNNING


def test_a_reply_for_a_task_not_running_is_the_worker_misbehaving():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    actions = m.task_replied(0, 99, (True, "late"))
    assert actions == [Misbehaved(0), Fail(1, FailCause.MISBEHAVED, 0), Signal(0, signal.SIGKILL)]
    assert "task 99" in actions[0].reason and actions[1].reason == actions[0].reason


def test_a_second_ready_is_the_worker_misbehaving_and_one_while_stopping_is_ignored():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    assert m.worker_ready(0) == [Misbehaved(0), Fail(1, FailCause.MISBEHAVED, 0), Signal(0, signal.SIGKILL)]
    m2, _ = machine(1)
    m2.submit(1, frame_bytes=LARGE)
    m2.shutdown(cancel_futures=True)  # stopped while it was starting
    assert m2.worker_ready(0) == []


def test_init_failed_is_a_starting_workers_word_and_out_of_turn_from_a_ready_one():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    assert m.worker_init_failed(0) == []  # starting: its exit will count as a failed start
    assert [type(a) for a in m.worker_exited(0)] == [WorkerGone, Spawn]
    assert m.start_failures == 1
    start(m, 0)
    assert m.worker_init_failed(0) == [Misbehaved(0), Fail(1, FailCause.MISBEHAVED, 0),
                                       Signal(0, signal.SIGKILL)]


def test_a_reply_carries_its_outcome_to_resolve_and_a_death_its_exit_to_the_failure():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    resolve = m.task_replied(0, 1, (True, 42))[0]
    assert resolve == Resolve(1) and resolve.outcome == (True, 42)
    actions = m.worker_exited(0, exited="the exit record")
    assert actions[:2] == [WorkerGone(0, Departure.RUNNING), Fail(2, FailCause.DIED, 0)]
    assert actions[0].exited == actions[1].exited == "the exit record"


def test_how_a_worker_left_is_said_first():
    def started(tasks: int = 1) -> StateMachine:
        m, _ = machine(1)
        for task_id in range(1, tasks + 1):
            m.submit(task_id, frame_bytes=LARGE)
        start(m, 0)
        return m
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    assert m.worker_exited(0)[0] == WorkerGone(0, Departure.AT_START)
    assert not any(isinstance(a, WorkerGone) for a in m.spawn_failed(0))  # no process
    assert started().worker_exited(0)[0] == WorkerGone(0, Departure.RUNNING)
    m = started()
    m.task_replied(0, 1)
    assert m.worker_exited(0)[0] == WorkerGone(0, Departure.IDLE)
    m = started()
    m.task_replied(0, 1)
    m.shutdown(cancel_futures=False)  # asked to exit
    assert m.worker_exited(0) == [WorkerGone(0, Departure.ASKED)] and m.closed


def test_only_frames_wholly_unread_count_as_unstarted_and_size_decides_pipelining():
    m, _ = machine(1, pipeline_depth=3, pipeline_max_frame=SMALL)
    m.submit(1, frame_bytes=SMALL), m.submit(2, frame_bytes=SMALL)
    m.submit(3, frame_bytes=SMALL + 1)  # one byte over: not sent ahead
    assert start_warm(m, 0) == [Send(0, 1), Send(0, 2)]
    # 150 bytes unread: all of task 2's frame and half of task 1's, which the worker had
    # begun to read (and so to unpickle: it may have run user code): 1 ran, 2 did not.
    assert exited(m, 0, unread_bytes=SMALL + SMALL // 2) == [Fail(1, FailCause.DIED, 0), Spawn(0)]
    assert m.queued == [2, 3]


def test_death_fails_only_the_running_task_and_refills_the_slot():
    m, _ = machine(2)
    for task in (1, 2, 3):
        m.submit(task, frame_bytes=LARGE)
    start(m, 0, 1)
    actions = exited(m, 0)
    assert actions == [Fail(1, FailCause.DIED, 0), Spawn(0)]
    assert m.task_state(2) is TaskState.RUNNING  # on the other worker, untouched
    assert m.queued == [3]
    assert start(m, 0) == [Send(0, 3)]


def test_death_requeues_tasks_received_but_not_started_at_the_front():
    m, _ = machine(1, pipeline_depth=3)
    for task in (1, 2, 3, 4):
        m.submit(task, frame_bytes=SMALL)
    assert start_warm(m, 0) == [Send(0, 1), Send(0, 2), Send(0, 3)]
    assert [m.task_state(t) for t in (1, 2, 3)] == [TaskState.RUNNING, TaskState.ASSIGNED,
                                                    TaskState.ASSIGNED]
    actions = exited(m, 0)
    assert actions == [Fail(1, FailCause.DIED, 0), Spawn(0)]  # 2 and 3 are not failed
    assert m.queued == [2, 3, 4]  # and keep their place ahead of 4
    assert start_warm(m, 0) == [Send(0, 2), Send(0, 3), Send(0, 4)]


def test_tasks_left_unread_in_the_pipe_are_requeued_even_the_first():
    m, _ = machine(1, pipeline_depth=2)
    m.submit(1, frame_bytes=SMALL), m.submit(2, frame_bytes=SMALL)
    start_warm(m, 0)
    assert exited(m, 0, unread_bytes=2 * SMALL) == [Spawn(0)]  # it read neither
    assert m.queued == [1, 2]
    start_warm(m, 0)
    assert exited(m, 0, unread_bytes=SMALL) == [Fail(1, FailCause.DIED, 0), Spawn(0)]
    assert m.queued == [2]


def test_large_tasks_are_not_pipelined_behind_a_running_one():
    m, _ = machine(1, pipeline_depth=2)
    m.submit(1, frame_bytes=SMALL)
    m.submit(2, frame_bytes=LARGE)
    assert start(m, 0) == [Send(0, 1)]
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2)]


def test_idle_worker_death_is_refilled_without_touching_tasks():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.task_replied(0, 1)
    assert exited(m, 0) == [Spawn(0)]


def test_repeated_start_failures_break_the_pool_and_fail_waiting_tasks():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    actions = []
    for _ in range(MAX_START_FAILURES):
        actions = exited(m, 0)  # died while STARTING
    assert actions == [Broken(), Fail(1, FailCause.BROKEN), Fail(2, FailCause.BROKEN)]
    assert m.slots[0].state is SlotState.EMPTY and m.schedule() == []  # no fork loop
    assert m.closed  # broken, with nothing left to run: it ends by itself


def broken_while_slot_0_runs_task_1() -> StateMachine:
    """Slot 0 runs task 1; task 2 waited for slot 1, whose workers kept failing to start."""
    m, _ = machine(2)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    for _ in range(MAX_START_FAILURES - 1):
        exited(m, 1)
    assert exited(m, 1) == [Broken(), Fail(2, FailCause.BROKEN)]
    assert m.life is PoolLife.BROKEN and m.queued == []
    return m


def test_a_broken_pool_fails_a_task_its_dying_worker_never_started_and_closes():
    # Slot 0 runs task 1 while slot 1 keeps failing to start: the pool breaks. When slot 0's
    # worker then dies before reading task 1, no worker will ever run it: it fails at once
    # (it used to wait in the queue, and shutdown never finished).
    m = broken_while_slot_0_runs_task_1()
    assert exited(m, 0, unread_bytes=LARGE) == [Fail(1, FailCause.BROKEN)]
    assert m.closed  # nothing runs, nothing waits: the broken pool ends by itself


def test_a_broken_pool_lets_running_tasks_finish_stops_idle_workers_then_closes():
    m, _ = machine(3)
    for task_id in (1, 2, 3):
        m.submit(task_id, frame_bytes=LARGE)
    start(m, 0, 1)  # tasks 1 and 2 run; 3 waits for slot 2, which keeps failing to start
    for _ in range(MAX_START_FAILURES - 1):
        assert exited(m, 2) == [Spawn(2)]
    assert exited(m, 2) == [Broken(), Fail(3, FailCause.BROKEN)]
    assert m.life is PoolLife.BROKEN
    assert m.submit(4, frame_bytes=LARGE) == [Fail(4, FailCause.BROKEN)]  # sent before the caller knew
    assert m.task_replied(1, 2) == [Resolve(2), AskToExit(1)]  # idle: stopped at once
    assert m.shutdown(cancel_futures=False) == []  # already draining
    assert exited(m, 1) == [] and not m.closed
    assert m.task_replied(0, 1) == [Resolve(1), AskToExit(0)]
    assert exited(m, 0) == [] and m.closed


def test_a_broken_pool_runs_tasks_taken_back_on_a_worker_that_did_start():
    m, clock = machine(2, pipeline_depth=2)
    m.submit(1, frame_bytes=SMALL), m.submit(2, frame_bytes=SMALL)
    start_warm(m, 0)  # 1 runs, 2 is sent ahead behind it
    for _ in range(MAX_START_FAILURES):
        exited(m, 1)
    clock.now += RECLAIM_AFTER_SECONDS
    assert m.tick() == [Reclaim(0)]
    assert m.tasks_reclaimed(0, [2]) == []  # queued again: slot 0 is READY and will take it
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2)]
    assert m.task_replied(0, 2) == [Resolve(2), AskToExit(0)]
    assert exited(m, 0) == [] and m.closed


def test_a_failed_write_in_a_broken_pool_fails_the_task_once_no_worker_is_left():
    m = broken_while_slot_0_runs_task_1()
    # Back in the queue, but the only worker is being killed: no worker is left to take it.
    assert m.send_failed(0, 1) == [Signal(0, signal.SIGKILL), Fail(1, FailCause.BROKEN)]
    assert exited(m, 0) == [] and m.closed  # (it used to wait in the queue for good)


def test_a_failed_write_while_terminating_cancels_the_task():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.terminate(signal.SIGTERM)
    assert m.send_failed(0, 1) == [Stopped(1), Signal(0, signal.SIGKILL)]
    assert exited(m, 0) == [] and m.closed


def test_the_pools_life_moves_only_as_its_table_allows():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    assert m.terminate(signal.SIGTERM) == [Signal(0, signal.SIGTERM)]
    assert m.life is PoolLife.TERMINATING
    assert m.shutdown(cancel_futures=False) == []  # still terminating
    exited(m, 0)
    assert m.life is PoolLife.CLOSED
    assert m.terminate(signal.SIGKILL) == [] and m.shutdown(cancel_futures=True) == []
    with pytest.raises(InvalidTransition, match="submit while CLOSED"):
        m.submit(2, frame_bytes=LARGE)


def test_a_completed_task_resets_the_start_failure_count():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    for _ in range(MAX_START_FAILURES - 1):
        exited(m, 0)
    start(m, 0)
    m.task_replied(0, 1)
    assert m.start_failures == 0


def test_max_tasks_per_child_retires_then_refills():
    m, _ = machine(1, max_tasks_per_child=2)
    for task in (1, 2, 3):
        m.submit(task, frame_bytes=LARGE)
    start(m, 0)
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2)]
    assert m.slots[0].state is SlotState.RETIRING
    assert m.task_replied(0, 2) == [Resolve(2), AskToExit(0)]
    assert exited(m, 0) == [Spawn(0)]
    assert start(m, 0) == [Send(0, 3)]


def test_a_cancelled_last_task_gives_its_quota_back():
    m, _ = machine(1, max_tasks_per_child=1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    assert start(m, 0) == [Send(0, 1)]
    assert m.slots[0].state is SlotState.RETIRING
    assert m.send_cancelled(0, 1) == [Send(0, 2)]  # the worker never got task 1
    assert m.task_replied(0, 2) == [Resolve(2), AskToExit(0)]


def test_cancelled_before_send_is_withdrawn():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    assert start(m, 0) == [Send(0, 1)]
    assert m.send_cancelled(0, 1) == [Send(0, 2)]
    assert m.task_state(1) is None


def test_failed_send_requeues_and_kills_the_worker():
    m, clock = machine(2)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    actions = m.send_failed(0, 1)
    assert actions[0] == Signal(0, signal.SIGKILL)
    assert m.task_state(1) is TaskState.QUEUED
    assert m.slots[0].state is SlotState.STOPPING
    assert exited(m, 0)[:1] == [Spawn(0)]  # nothing failed: it never ran


def test_misbehaving_worker_fails_its_task_and_is_killed():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    assert m.worker_misbehaved(0, "garbage") == [Misbehaved(0), Fail(1, FailCause.MISBEHAVED, 0),
                                                 Signal(0, signal.SIGKILL)]
    assert exited(m, 0) == [Spawn(0)]


def test_shutdown_finishes_queued_work_then_stops_every_worker():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    assert m.shutdown(cancel_futures=False) == []
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2)]
    assert m.task_replied(0, 2) == [Resolve(2), AskToExit(0)]
    assert m.life is PoolLife.DRAINING
    assert exited(m, 0) == []
    assert m.closed


def test_shutdown_with_cancel_futures_cancels_only_queued():
    m, _ = machine(1)
    for task in (1, 2, 3):
        m.submit(task, frame_bytes=LARGE)
    start(m, 0)
    assert m.shutdown(cancel_futures=True) == [Cancel(2), Cancel(3)]
    assert m.task_replied(0, 1) == [Resolve(1), AskToExit(0)]


def test_shutdown_of_an_unused_pool_closes_at_once():
    m, _ = machine(2)
    assert m.shutdown(cancel_futures=False) == []
    assert m.closed


def test_submit_after_shutdown_is_an_internal_error():
    m, _ = machine(1)
    m.shutdown(cancel_futures=False)
    with pytest.raises(InvalidTransition):
        m.submit(1, frame_bytes=LARGE)


def test_stop_escalates_terminate_then_kill_then_reports():
    m, clock = machine(1, timeouts=Timeouts(stop=3, terminate=2, kill=5))
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.task_replied(0, 1)
    assert m.shutdown(cancel_futures=False) == [AskToExit(0)]
    assert m.next_deadline() == clock.now + 3
    assert m.tick() == []
    clock.now += 3
    assert m.tick() == [Signal(0, signal.SIGTERM)]
    clock.now += 2
    assert m.tick() == [Signal(0, signal.SIGKILL)]
    clock.now += 5
    assert m.tick() == [Unreaped(0)]
    assert m.slots[0].stopping.escalation is Escalation.GIVEN_UP and m.next_deadline() is None
    assert exited(m, 0) == [] and m.closed


def test_starting_worker_is_stopped_when_no_longer_needed():
    m, _ = machine(2)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)  # slot 0 and slot 1 start
    start(m, 0)               # slot 0 takes task 1; task 2 waits for slot 1
    assert m.shutdown(cancel_futures=True) == [Cancel(2), AskToExit(1)]
    assert m.worker_ready(1) == []  # stopped while starting: it gets nothing
    assert exited(m, 1) == []
    assert m.start_failures == 0  # asked to stop: its exit is not a failed start
    assert m.task_replied(0, 1) == [Resolve(1), AskToExit(0)]
    assert exited(m, 0) == [] and m.closed


def test_every_transition_outside_the_tables_is_refused():
    m, _ = machine(1)
    with pytest.raises(InvalidTransition):
        m.worker_ready(0)  # UNUSED -> READY skips STARTING


# --- timeouts, stopping, terminating, memory ------------------------------------------------

def test_a_timeout_counts_from_the_start_of_running_not_from_submit():
    m, clock = machine(1)
    m.submit(1, frame_bytes=LARGE, timeout=2.0)
    clock.now += 50  # a slow start does not eat into the task's time
    start(m, 0)
    assert m.next_deadline() == clock.now + 2.0
    clock.now += 1.9
    assert m.tick() == []
    clock.now += 0.1
    assert m.tick() == [DumpStack(0)]
    assert m.slots[0].stopping.escalation is Escalation.DUMPING
    assert m.slots[0].stopping.ending is Ending.TIMED_OUT


def test_a_timed_out_task_fails_with_its_timeout_and_the_slot_is_refilled():
    m, clock = machine(1, timeouts=Timeouts(dump=1.0, kill=5.0))
    m.submit(1, frame_bytes=LARGE, timeout=2.0), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    clock.now += 2
    assert m.tick() == [DumpStack(0)]
    clock.now += 1  # it did not write its stack and exit in time: killed
    assert m.tick() == [Signal(0, signal.SIGKILL)]
    assert exited(m, 0) == [Fail(1, FailCause.TIMED_OUT, 0, 2.0), Spawn(0)]
    assert m.worker_ready(0) == [Send(0, 2)]


def test_the_next_task_on_a_worker_gets_its_own_clock():
    m, clock = machine(1, pipeline_depth=2)
    m.submit(1, frame_bytes=SMALL, timeout=5.0), m.submit(2, frame_bytes=SMALL, timeout=1.0)
    start_warm(m, 0)
    clock.now += 4
    assert m.task_replied(0, 1) == [Resolve(1)]
    assert m.next_deadline() == clock.now + 1.0  # task 2 started now, not when it was sent


def test_a_reply_that_beats_the_kill_wins_over_the_timeout():
    m, clock = machine(1)
    m.submit(1, frame_bytes=LARGE, timeout=1.0)
    start(m, 0)
    clock.now += 1
    assert m.tick() == [DumpStack(0)]
    assert m.task_replied(0, 1) == [Resolve(1)]
    assert exited(m, 0) == [Spawn(0)]  # the worker still goes; nothing else fails


def test_stopping_a_queued_task_cancels_it():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    assert m.stop_task(2) == [Stopped(2)]
    assert m.queued == [1] and m.task_state(2) is None
    assert m.stop_task(2) == []  # already ended: nothing to do


def test_stopping_a_running_task_kills_its_worker_and_cancels_it():
    m, _ = machine(2)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0, 1)
    assert m.stop_task(1) == [Signal(0, signal.SIGKILL)]
    assert m.slots[0].stopping.ending is Ending.STOPPED
    assert exited(m, 0) == [Stopped(1, ran=True), Spawn(0)]
    assert m.task_state(2) is TaskState.RUNNING  # the other worker's task is untouched


def test_stopping_a_task_waiting_behind_another_takes_it_back():
    m, _ = machine(1, pipeline_depth=3)
    for task in (1, 2, 3):
        m.submit(task, frame_bytes=SMALL)
    start_warm(m, 0)
    assert m.stop_task(2) == [Reclaim(0)]
    assert m.tasks_reclaimed(0, [2, 3]) == [Stopped(2), Send(0, 3)]
    assert m.task_state(2) is None and m.task_state(1) is TaskState.RUNNING


def test_stopping_a_task_the_worker_already_read_stops_it_when_it_starts():
    m, _ = machine(1, pipeline_depth=2)
    m.submit(1, frame_bytes=SMALL), m.submit(2, frame_bytes=SMALL)
    start_warm(m, 0)
    assert m.task_state(2) is TaskState.ASSIGNED
    assert m.stop_task(2) == [Reclaim(0)]
    assert m.tasks_reclaimed(0, []) == []  # too late: it was read
    assert m.task_replied(0, 1) == [Resolve(1), Signal(0, signal.SIGKILL)]
    assert exited(m, 0) == [Stopped(2, ran=True), Spawn(0)]


def test_tasks_behind_one_that_runs_long_are_taken_back_once_and_run_elsewhere():
    m, clock = machine(2, pipeline_depth=3)
    for task in (1, 2, 3):
        m.submit(task, frame_bytes=SMALL)
    start_warm(m, 0)
    assert list(m.slots[0].in_flight) == [1, 2, 3]
    assert m.next_deadline() == clock.now + RECLAIM_AFTER_SECONDS
    clock.now += RECLAIM_AFTER_SECONDS
    assert m.tick() == [Reclaim(0)]
    # once per running task (the next deadline: checking that the worker read task 1)
    assert m.next_deadline() == clock.now - RECLAIM_AFTER_SECONDS + UNREAD_AFTER_SECONDS
    assert m.tick() == []
    assert m.tasks_reclaimed(0, [3]) == []  # the worker had read task 2 already
    assert m.queued == [3]
    assert start_warm(m, 1) == [Send(1, 3)]
    m.submit(4, frame_bytes=SMALL)
    assert m.slots[0].in_flight == deque([1, 2])  # not queued behind the long one again
    with pytest.raises(InvalidTransition):
        m.tasks_reclaimed(0, [3])  # not in flight there
    with pytest.raises(InvalidTransition):
        m.tasks_reclaimed(0, [2, 1])  # not in the order sent


def test_the_worker_may_take_a_later_task_while_earlier_ones_are_taken_back():
    m, _ = machine(1, pipeline_depth=4)
    for task in (1, 2, 3, 4):
        m.submit(task, frame_bytes=SMALL)
    start_warm(m, 0)
    # It had not read task 1 yet; while 1 and 3 were taken, it read 2 (and then 4).
    # 2 runs now (just started, so 1 and 3 may queue behind it again: the only worker).
    assert m.tasks_reclaimed(0, [1, 3]) == [Send(0, 1), Send(0, 3)]
    assert m.slots[0].in_flight == deque([2, 4, 1, 3])
    assert m.task_state(2) is TaskState.RUNNING and m.task_state(4) is TaskState.ASSIGNED
    assert m.task_replied(0, 2)[0] == Resolve(2)


def test_taking_back_every_task_sent_requeues_the_running_one_too():
    m, _ = machine(1, pipeline_depth=2, max_tasks_per_child=2)
    m.submit(1, frame_bytes=SMALL), m.submit(2, frame_bytes=SMALL)
    start_warm(m, 0)
    assert m.slots[0].state is SlotState.RETIRING  # its quota is used up by 1 and 2
    assert m.tasks_reclaimed(0, [1, 2]) == [Send(0, 1), Send(0, 2)]  # it never read them
    assert m.task_state(1) is TaskState.RUNNING and m.slots[0].worker.assigned_count == 2


def test_no_pipelining_behind_a_long_running_task_or_into_a_pipe_that_cannot_give_back():
    m, clock = machine(2, pipeline_depth=3)
    m.submit(1, frame_bytes=SMALL)
    start_warm(m, 0)
    clock.now += 2 * RECLAIM_AFTER_SECONDS
    m.submit(2, frame_bytes=SMALL)
    assert m.queued == [2]
    m.slots[1].worker.last_duration = 0.0
    assert m.worker_ready(1, pipelining=False) == [Send(1, 2)]
    m.submit(3, frame_bytes=SMALL)
    assert m.queued == [3]


def test_stopping_a_task_that_timed_out_reports_the_timeout():
    m, clock = machine(1)
    m.submit(1, frame_bytes=LARGE, timeout=1.0)
    start(m, 0)
    clock.now += 1
    m.tick()
    assert m.stop_task(1) == []
    assert exited(m, 0) == [Fail(1, FailCause.TIMED_OUT, 0, 1.0), Spawn(0)]


def test_terminate_cancels_the_queue_and_escalates_sigterm_to_sigkill():
    m, clock = machine(2, timeouts=Timeouts(terminate=0.5, kill=5.0))
    for task_id in range(1, 5):
        m.submit(task_id, frame_bytes=LARGE)
    start(m, 0, 1)
    assert m.terminate(signal.SIGTERM) == [Cancel(3), Cancel(4), Signal(0, signal.SIGTERM),
                                           Signal(1, signal.SIGTERM)]
    assert m.life is PoolLife.TERMINATING
    assert exited(m, 0) == [Fail(1, FailCause.TERMINATED, 0)]  # no refill while terminating
    clock.now += 0.5
    assert m.tick() == [Signal(1, signal.SIGKILL)]  # slot 1 ignores SIGTERM
    assert exited(m, 1) == [Fail(2, FailCause.TERMINATED, 1)]
    assert m.closed


def test_kill_workers_sends_sigkill_at_once_and_cancels_unstarted_tasks():
    m, _ = machine(1, pipeline_depth=3)
    for task_id in (1, 2, 3):
        m.submit(task_id, frame_bytes=SMALL)
    start_warm(m, 0)
    assert m.terminate(signal.SIGKILL) == [Signal(0, signal.SIGKILL)]
    assert exited(m, 0, unread_bytes=SMALL) == [Fail(1, FailCause.TERMINATED, 0), Stopped(3), Stopped(2)]
    assert m.closed


def test_terminate_escalates_a_worker_already_asked_to_stop():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.task_replied(0, 1)
    assert m.shutdown(cancel_futures=False) == [AskToExit(0)]
    assert m.terminate(signal.SIGTERM) == [Signal(0, signal.SIGTERM)]
    assert m.slots[0].stopping.escalation is Escalation.TERMINATED


def test_a_worker_over_its_memory_limit_retires_after_its_reply():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    assert m.worker_over_memory(0) == []
    assert m.slots[0].state is SlotState.RETIRING
    assert m.task_replied(0, 1) == [Resolve(1), AskToExit(0)]
    assert exited(m, 0) == [Spawn(0)]
    assert m.worker_ready(0) == [Send(0, 2)]


def test_a_worker_given_up_on_is_dropped_and_its_task_fails():
    m, clock = machine(1, timeouts=Timeouts(kill=5.0))
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.stop_task(1)
    clock.now += 5
    assert m.tick() == [Unreaped(0)]
    assert m.slots[0].stopping.escalation is Escalation.GIVEN_UP
    # The dispatcher reports the pid and drops the process; the slot is refilled.
    assert exited(m, 0) == [Stopped(1, ran=True), Spawn(0)]


def test_small_tasks_queue_behind_a_worker_only_while_its_tasks_are_short():
    m, clock = machine(1, pipeline_depth=3)
    for task_id in (1, 2, 3, 4, 5):
        m.submit(task_id, frame_bytes=SMALL)
    assert start(m, 0, pipelining=True) == [Send(0, 1)]  # new: nothing known, one at a time
    clock.now += 0.0005
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2), Send(0, 3), Send(0, 4)]
    clock.now += 5  # task 2 turned out long: 3 and 4 waited behind it (the price)...
    assert m.task_replied(0, 2) == [Resolve(2)]  # ...but nothing more joins them
    assert m.task_replied(0, 3) == [Resolve(3), Send(0, 5)]  # 3 was short again



def test_replies_that_arrive_together_resolve_in_order_then_assign_once():
    m, clock = machine(1, pipeline_depth=3)
    for task_id in (1, 2, 3, 4, 5, 6):
        m.submit(task_id, frame_bytes=SMALL)
    start_warm(m, 0)  # sends 1, 2 and 3
    clock.now += 0.0005
    # One pass over the slots after all three: the pipeline is refilled in one go.
    assert m.tasks_replied(0, [(1, (True, "a")), (2, (True, "b")), (3, (True, "c"))]) == [
        Resolve(1), Resolve(2), Resolve(3), Send(0, 4), Send(0, 5), Send(0, 6)]
    assert [m.task_state(t) for t in (4, 5, 6)] == [
        TaskState.RUNNING, TaskState.ASSIGNED, TaskState.ASSIGNED]


def test_a_reply_out_of_turn_in_a_batch_ends_the_batch_as_misbehaviour():
    m, _ = machine(1, pipeline_depth=3)
    for task_id in (1, 2, 3):
        m.submit(task_id, frame_bytes=SMALL)
    start_warm(m, 0)
    actions = m.tasks_replied(0, [(1, None), (3, None), (2, None)])
    # 1 was running: its reply counts. 3 was not: the worker misbehaved, 2 (now running)
    # fails with it, and nothing after the bad reply is believed.
    assert actions[:3] == [Resolve(1), Misbehaved(0), Fail(2, FailCause.MISBEHAVED, 0)]
    assert Resolve(2) not in actions and m.task_state(3) is TaskState.QUEUED



def test_a_batch_that_completes_a_task_resets_the_failed_starts_even_if_it_ends_badly():
    m, _ = machine(2, pipeline_depth=2)
    for task_id in (1, 2):
        m.submit(task_id, frame_bytes=SMALL)
    start_warm(m, 0)
    m._starts.failures = MAX_START_FAILURES - 1  # (as if other slots kept failing to start)
    m.tasks_replied(0, [(1, None), (99, None)])  # task 1 completed, then garbage
    assert m.start_failures == 0  # a task completed in between: the pool is not broken
    assert m.life is PoolLife.OPEN


# -- idle_timeout ---------------------------------------------------------------------------

def test_an_idle_worker_is_stopped_after_idle_timeout_and_not_refilled_until_work_comes():
    m, clock = machine(2, idle_timeout=10.0)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    assert m.next_deadline() is None  # busy: no idle clock runs
    clock.now += 3
    m.task_replied(0, 1)  # idle from now
    assert m.next_deadline() == clock.now + 10
    clock.now += 9.9
    assert m.tick() == []
    clock.now += 0.1
    assert m.tick() == [AskToExit(0)]
    assert m.slots[0].state is SlotState.STOPPING
    assert exited(m, 0) == []  # not refilled: nothing needs a worker
    assert m.slots[0].state is SlotState.EMPTY
    assert m.next_deadline() is None  # an idle pool with no workers never wakes up
    assert m.submit(2, frame_bytes=LARGE) == [Spawn(0)]  # new work starts a worker again
    assert m.worker_ready(0) == [Send(0, 2)]


def test_the_idle_clock_restarts_with_each_task_and_spares_busy_workers():
    m, clock = machine(2, idle_timeout=10.0)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0, 1)
    m.task_replied(0, 1)
    clock.now += 8
    m.submit(3, frame_bytes=LARGE)  # slot 0 is idle: it takes it, and its idle clock stops
    assert m.task_state(3) is TaskState.RUNNING
    clock.now += 8
    assert m.tick() == []  # slot 0 busy, slot 1 still running task 2
    m.task_replied(0, 3)
    clock.now += 9
    assert m.tick() == []
    clock.now += 1
    assert m.tick() == [AskToExit(0)]
    assert m.slots[1].state is SlotState.READY  # still running task 2


def test_idle_workers_are_not_stopped_for_idling_once_draining():
    m, clock = machine(1, idle_timeout=10.0)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.task_replied(0, 1)
    assert m.shutdown(cancel_futures=False) == [AskToExit(0)]  # stopped by the shutdown
    clock.now += 20  # past the idle timeout and the stop grace: escalation, no second AskToExit
    assert m.tick() == [Signal(0, signal.SIGTERM)]
    assert not m.slots[0].idled_out


def test_a_worker_that_dies_while_idle_is_still_refilled_at_once():
    m, clock = machine(1, idle_timeout=10.0)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    m.task_replied(0, 1)
    assert exited(m, 0) == [Spawn(0)]  # a death, not an idle stop: refill as before


def test_a_stopped_running_task_says_it_ran_and_a_stopped_queued_one_says_it_did_not():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE), m.submit(2, frame_bytes=LARGE)
    start(m, 0)
    assert m.stop_task(2) == [Stopped(2, ran=False)]
    m.stop_task(1)
    assert exited(m, 0) == [Stopped(1, ran=True), Spawn(0)]


def test_tasks_cancelled_in_the_queue_leave_it_wherever_they_are():
    m, _ = machine(1)
    for task_id in range(1, 7):
        m.submit(task_id, frame_bytes=LARGE)
    start(m, 0)  # task 1 runs; 2..6 wait
    assert m.callers_cancelled([6, 3, 2, 1, 99]) == [Stopped(6), Stopped(3), Stopped(2)]
    assert m.queued == [4, 5] and m.census() == (2, 1)
    assert m.task_state(3) is None
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 4)]  # the front skips what left
    assert m.callers_cancelled([4, 5]) == [Stopped(5)]  # 4 was sent meanwhile: not queued
    assert m.queued == [] and m.census() == (0, 1)
    assert m.callers_cancelled([]) == []


def test_a_running_task_stopped_before_its_worker_read_it_ends_stopped_not_requeued():
    """stop() of a task just sent: the worker is killed before it has read the call (the
    whole frame is still in its pipe). It never started, but its caller stopped it: it
    ends cancelled, and is not sent again (it was, and hung a test under spawn in CI)."""
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    assert m.stop_task(1) == [Signal(0, signal.SIGKILL)]
    assert exited(m, 0, unread_bytes=LARGE) == [Stopped(1), Spawn(0)]
    assert m.task_state(1) is None and m.queued == []


# -- starts the system refuses (out of descriptors, processes, memory) ----------------------

def test_a_refused_start_is_tried_again_after_a_delay_that_doubles():
    m, clock = machine(1)
    assert m.submit(1, frame_bytes=LARGE) == [Spawn(0)]
    delays = []
    for _ in range(5):
        assert m.spawn_refused(0) == []  # no spin: nothing starts at once
        assert m.slots[0].state is SlotState.EMPTY and m.queued == [1]
        delays.append(m.next_deadline() - clock.now)
        assert m.tick() == []  # not yet
        clock.now = m.next_deadline()
        assert m.tick() == [Spawn(0)]
    assert delays == pytest.approx([START_RETRY_FIRST_SECONDS * 2 ** i for i in range(5)])
    assert m.life is PoolLife.OPEN  # a refusal is not a failed start: the pool never breaks
    assert start(m, 0) == [Send(0, 1)]
    assert m.refused_starts == 0  # a worker that starts ends the streak


def test_the_delay_between_tries_is_bounded():
    m, clock = machine(1)
    delays = []
    for task_id in range(20):
        m.submit(task_id, frame_bytes=LARGE)  # (the queue fails after a while: refill it)
        if m.slots[0].state is not SlotState.STARTING:
            clock.now = m.next_deadline()
            assert m.tick() == [Spawn(0)]
        m.spawn_refused(0)
        delays.append(m.next_deadline() - clock.now)
    assert max(delays) == delays[-1] == pytest.approx(START_RETRY_MAX_SECONDS)


def test_refused_starts_fail_what_is_queued_only_once_no_worker_can_take_it():
    m, clock = machine(1)
    for task_id in (1, 2):
        m.submit(task_id, frame_bytes=LARGE)
    for attempt in range(1, MAX_REFUSED_STARTS):
        assert m.spawn_refused(0) == []
        clock.now = m.next_deadline()
        assert m.tick() == [Spawn(0)]
    assert m.spawn_refused(0) == [Fail(1, FailCause.REFUSED), Fail(2, FailCause.REFUSED)]
    assert m.life is PoolLife.OPEN
    # A task submitted later waits for the next try, and fails if that one is refused too...
    assert m.submit(3, frame_bytes=LARGE) == []
    clock.now = m.next_deadline()
    assert m.tick() == [Spawn(0)]
    assert m.spawn_refused(0) == [Fail(3, FailCause.REFUSED)]
    # ... or runs once a worker starts.
    m.submit(4, frame_bytes=LARGE)
    clock.now = m.next_deadline()
    assert m.tick() == [Spawn(0)]
    assert start(m, 0) == [Send(0, 4)]


def test_while_a_worker_runs_refused_starts_never_fail_a_task():
    m, clock = machine(2)
    m.submit(1, frame_bytes=LARGE)
    start(m, 0)
    assert m.submit(2, frame_bytes=LARGE) == [Spawn(1)]
    for _ in range(2 * MAX_REFUSED_STARTS):
        assert m.spawn_refused(1) == []
        clock.now = m.next_deadline()
        assert m.tick() == [Spawn(1)]
    assert m.task_replied(0, 1) == [Resolve(1), Send(0, 2)]  # the running worker takes it


def test_starts_refused_in_one_round_count_as_one_refusal():
    m, clock = machine(3)
    spawns = [m.submit(i, frame_bytes=LARGE) for i in (1, 2, 3)]
    assert spawns == [[Spawn(0)], [Spawn(1)], [Spawn(2)]]
    for slot in (0, 1, 2):
        assert m.spawn_refused(slot) == []
    assert m.refused_starts == 1
    assert m.next_deadline() == clock.now + START_RETRY_FIRST_SECONDS
    clock.now = m.next_deadline()
    assert m.tick() == [Spawn(0)]  # one start at a time, to see whether the system lets it
    assert m.schedule() == []  # (not a second while that one starts)
    assert start(m, 0) == [Send(0, 1), Spawn(1), Spawn(2)]  # it did: the rest start


def test_a_slot_whose_start_was_refused_is_tried_until_it_starts_work_or_not():
    m, clock = machine(1)
    m.submit(1, frame_bytes=LARGE)
    m.spawn_refused(0)
    assert m.callers_cancelled([1]) == [Stopped(1)]  # its caller gave up on it
    for _ in range(3):  # the pool gets back to its size once the system lets it
        clock.now = m.next_deadline()
        assert m.tick() == [Spawn(0)]
        m.spawn_refused(0)
    clock.now = m.next_deadline()
    assert m.tick() == [Spawn(0)]
    assert start(m, 0) == [] and m.next_deadline() is None


def test_a_pool_shut_down_while_starts_are_refused_closes_once_the_queue_fails():
    m, clock = machine(1)
    m.submit(1, frame_bytes=LARGE)
    m.shutdown(cancel_futures=False)  # waits for task 1, which needs a worker
    for _ in range(MAX_REFUSED_STARTS - 1):
        m.spawn_refused(0)
        clock.now = m.next_deadline()
        assert m.tick() == [Spawn(0)]  # a draining pool still starts workers for its queue
    assert m.spawn_refused(0) == [Fail(1, FailCause.REFUSED)]
    assert m.closed


# -- a worker that does not read what it was sent (stopped: SIGSTOP, a debugger) ---------

def test_a_task_its_worker_has_not_begun_to_read_is_taken_back_and_run_elsewhere():
    m, clock = machine(2)
    m.submit(1, frame_bytes=SMALL), m.submit(2, frame_bytes=SMALL)
    start(m, 0, 1, pipelining=True)
    m.task_replied(1, 2)  # slot 1 is idle; slot 0 runs task 1 (as far as the parent knows)
    assert m.next_deadline() == clock.now + UNREAD_AFTER_SECONDS
    clock.now += UNREAD_AFTER_SECONDS
    assert m.tick() == [Reclaim(0)]  # has it read task 1?
    assert m.tick() == []  # (asked once)
    assert m.tasks_reclaimed(0, [1]) == [Send(1, 1)]  # no: it runs on the other worker
    # The stalled worker is sent nothing for a while, even when it is the only idle one.
    m.task_replied(1, 1)
    m.submit(3, frame_bytes=SMALL), m.submit(4, frame_bytes=SMALL)
    assert list(m.slots[1].in_flight) == [3] and m.queued == [4]
    assert m.next_deadline() == clock.now + STALL_FIRST_SECONDS
    clock.now += STALL_FIRST_SECONDS
    assert Send(0, 4) in m.tick()  # then it is tried again
    assert m.task_replied(0, 4) == [Resolve(4)] and m.slots[0].worker.stalls == 0  # it reads again


def test_a_worker_that_read_its_task_is_not_stalled():
    m, clock = machine(1)
    m.submit(1, frame_bytes=SMALL)
    start(m, 0, pipelining=True)
    clock.now += UNREAD_AFTER_SECONDS
    assert m.tick() == [Reclaim(0)]
    assert m.tasks_reclaimed(0, []) == []  # it has read it: it runs
    assert m.slots[0].worker.stalled_until is None and m.task_state(1) is TaskState.RUNNING
    assert m.next_deadline() is None  # nothing more to check for this task


def test_a_worker_that_keeps_not_reading_waits_longer_each_time():
    m, clock = machine(1)
    waits = []
    for task_id in range(1, 9):
        m.submit(task_id, frame_bytes=SMALL)
        if m.slots[0].state is SlotState.STARTING:
            start(m, 0, pipelining=True)
        assert list(m.slots[0].in_flight) == [task_id]
        clock.now += UNREAD_AFTER_SECONDS
        assert m.tick() == [Reclaim(0)]
        m.tasks_reclaimed(0, [task_id])
        m.callers_cancelled([task_id])  # (no other worker: its caller gives up on it)
        waits.append(m.slots[0].worker.stalled_until - clock.now)
        clock.now = m.slots[0].worker.stalled_until
        m.tick()
    assert waits == [min(STALL_FIRST_SECONDS * 2 ** i, STALL_MAX_SECONDS) for i in range(8)]


def test_no_read_check_where_the_frame_cannot_be_taken_back_whole():
    for frame_bytes, pipelining in ((SMALL, False), (LARGE, True)):
        m, clock = machine(1)  # a pipe without packets; a frame of more than one packet
        m.submit(1, frame_bytes=frame_bytes)
        start(m, 0, pipelining=pipelining)
        assert m.next_deadline() is None
        clock.now += 10 * UNREAD_AFTER_SECONDS
        assert m.tick() == []


def test_a_task_taken_back_unread_is_checked_again_wherever_it_runs_next():
    m, clock = machine(1)
    m.submit(1, frame_bytes=SMALL)
    start(m, 0, pipelining=True)
    clock.now += UNREAD_AFTER_SECONDS
    assert m.tick() == [Reclaim(0)]
    assert m.tasks_reclaimed(0, [1]) == []  # no other worker: it waits for this one
    clock.now = m.slots[0].worker.stalled_until
    assert m.tick() == [Send(0, 1)]  # sent again: and checked again
    assert m.next_deadline() == clock.now + UNREAD_AFTER_SECONDS


def test_a_stalled_worker_is_no_place_to_run_a_task_so_another_starts():
    m, clock = machine(2)
    m.submit(1, frame_bytes=SMALL)
    start(m, 0, pipelining=True)
    clock.now += UNREAD_AFTER_SECONDS
    m.tick()
    assert m.tasks_reclaimed(0, [1]) == [Spawn(1)]  # (the stopped one cannot take it)
    assert start(m, 1, pipelining=True) == [Send(1, 1)]


def test_a_worker_lost_track_of_while_starting_is_no_failed_start():
    m, _ = machine(1)
    m.submit(1, frame_bytes=LARGE)
    for _ in range(MAX_START_FAILURES + 1):  # (its forkserver exited, again and again)
        actions = m.worker_exited(0, lost_track=True)
        assert Spawn(0) in actions and m.life is PoolLife.OPEN
    assert m.start_failures == 0

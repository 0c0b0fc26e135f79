"""How the pool winds down: shutdown, terminate, a pool that breaks, starts refused too
long, closing (``pool._core.lifecycle``), with a fake clock."""

from __future__ import annotations

import signal

from core_parts import Parts
from pool._core.actions import Broken, Cancel, Fail, FailCause, Signal
from pool._core.start_failures import MAX_REFUSED_STARTS, MAX_START_FAILURES
from pool._core.states import PoolLife, TaskState

def test_shutdown_drains_or_cancels_the_queue_and_terminate_ends_every_worker():
    parts = Parts(2)
    parts.queue(1, 2)
    assert parts.lifecycle.shutdown(cancel_futures=True) == [Cancel(1), Cancel(2)]
    assert parts.records.life is PoolLife.DRAINING and not parts.records.tasks
    parts.ready(0)
    assert parts.lifecycle.terminate(signal.SIGTERM) == [Signal(0, signal.SIGTERM)]
    assert parts.records.life is PoolLife.TERMINATING


def test_failed_starts_break_the_pool_unless_it_is_terminating():
    parts = Parts(1)
    parts.queue(1)
    for _ in range(MAX_START_FAILURES):
        assert parts.lifecycle.break_if_failing() == []
        parts.starts.start_failed()
    assert parts.lifecycle.break_if_failing() == [Broken(), Fail(1, FailCause.BROKEN)]
    assert parts.records.life is PoolLife.BROKEN
    terminating = Parts(1)
    terminating.records.move_life(PoolLife.TERMINATING)
    for _ in range(MAX_START_FAILURES):
        terminating.starts.start_failed()
    assert terminating.lifecycle.break_if_failing() == []


def test_a_broken_pool_fails_its_queue_once_no_ready_worker_is_left():
    parts = Parts(2)
    parts.ready(0)
    parts.records.move_life(PoolLife.BROKEN)
    parts.queue(1)
    assert parts.lifecycle.fail_stranded() == []
    parts.empty(0)
    assert parts.lifecycle.fail_stranded() == [Fail(1, FailCause.BROKEN)]


def test_refused_starts_fail_the_queue_only_with_no_worker_to_run_it():
    parts = Parts(2)
    parts.queue(1)
    for _ in range(MAX_REFUSED_STARTS):
        assert parts.lifecycle.fail_if_refused_too_long() == []
        parts.starts.start_refused(parts.clock.now)
        parts.starts.retry_due()
    parts.ready(1)
    assert parts.lifecycle.fail_if_refused_too_long() == []
    parts.empty(1)
    assert parts.lifecycle.fail_if_refused_too_long() == [Fail(1, FailCause.REFUSED)]
    assert parts.records.life is PoolLife.OPEN


def test_an_ending_pool_closes_once_no_task_and_no_worker_is_left():
    parts = Parts(2)
    parts.queue(1)
    parts.lifecycle.close_if_done()
    assert parts.records.life is PoolLife.OPEN  # an open pool never closes by itself
    parts.lifecycle.shutdown(cancel_futures=False)
    parts.ready(0)
    parts.lifecycle.close_if_done()
    assert parts.records.life is PoolLife.DRAINING
    parts.records.move_task(parts.records.tasks[1], TaskState.CANCELLED)
    parts.records.queue.forget_ended()
    parts.empty(0)
    parts.lifecycle.close_if_done()
    assert parts.records.life is PoolLife.CLOSED

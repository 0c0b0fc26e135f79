"""How the machine puts its parts together, where the event tests in test_state.py do not
look: a terminate that follows the shutdown's own pass, and a tick that schedules once."""

from __future__ import annotations

import signal

from pool._core.actions import AskToExit, Reclaim, Send, Signal, Spawn
from pool._core.machine import StateMachine
from pool._core.stalls import STALL_FIRST_SECONDS, UNREAD_AFTER_SECONDS
from pool._core.states import PoolLife
from core_parts import FakeClock


def test_terminating_a_pool_that_never_started_a_worker_closes_it():
    m = StateMachine(2, FakeClock())
    assert m.terminate(signal.SIGTERM) == [] and m.life is PoolLife.CLOSED


def test_terminate_asks_idle_workers_to_stop_as_shutdown_does_then_signals_them():
    m = StateMachine(2, FakeClock())
    m.submit(1, frame_bytes=100)
    m.worker_ready(0)
    m.task_replied(0, 1)
    assert m.terminate(signal.SIGTERM) == [AskToExit(0), Signal(0, signal.SIGTERM)]
    assert m.life is PoolLife.TERMINATING


def test_a_tick_that_ends_stalls_schedules_once_after_every_deadline_fired():
    clock = FakeClock()
    m = StateMachine(2, clock)
    assert m.submit(1, frame_bytes=100) == [Spawn(0)]
    assert m.submit(2, frame_bytes=100) == [Spawn(1)]
    assert m.worker_ready(0) + m.worker_ready(1) == [Send(0, 1), Send(1, 2)]
    clock.now += UNREAD_AFTER_SECONDS
    assert m.tick() == [Reclaim(0), Reclaim(1)]  # neither worker read its task
    assert m.tasks_reclaimed(0, [1]) + m.tasks_reclaimed(1, [2]) == []  # both stalled
    assert m.queued == [2, 1] and m.next_deadline() == clock.now + STALL_FIRST_SECONDS
    clock.now += STALL_FIRST_SECONDS
    assert m.tick() == [Send(0, 2), Send(1, 1)]

"""What the pool logs on the ``pool`` logger: exactly one WARNING for each worker that dies
while running a task (its pid, exit code or signal, the task; the same facts in ``extra``),
and nothing for tasks that succeed, fail with an exception or time out."""

from __future__ import annotations

import logging

import pytest

import pool
import tasks
from helpers import wait_until


def deaths(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "pool_event", None) == "worker_died"]


def test_a_death_during_a_task_is_one_warning_with_the_facts(ctx, caplog):
    caplog.set_level(logging.DEBUG, logger="pool")
    with pool.ProcessPool(1, mp_context=ctx) as p:
        exited = p.submit(tasks.exit_hard, 3)
        with pytest.raises(pool.WorkerDied) as first:
            exited.result(60)
        killed = p.submit(tasks.sigkill_self)
        with pytest.raises(pool.WorkerDied) as second:
            killed.result(60)
        assert p.submit(tasks.square, 4).result(60) == 16
    records = deaths(caplog)
    assert len(records) == 2, [r.getMessage() for r in caplog.records]
    by_exit, by_signal = records
    for record, error in ((by_exit, first.value), (by_signal, second.value)):
        assert record.levelno == logging.WARNING and record.name == "pool"
        assert record.pool_worker_pid == error.pid                  # type: ignore[attr-defined]
        assert f"worker pid {error.pid} died" in record.getMessage()
        assert record.pool_task_id == error.task.task_id            # type: ignore[attr-defined]
    assert by_exit.pool_exitcode == 3 and by_exit.pool_signal is None  # type: ignore[attr-defined]
    assert "exit code 3" in by_exit.getMessage() and "exit_hard(3)" in by_exit.getMessage()
    assert by_signal.pool_signal == "SIGKILL"                       # type: ignore[attr-defined]
    assert by_signal.pool_exitcode == -9                            # type: ignore[attr-defined]
    assert "sigkill_self" in by_signal.pool_task                    # type: ignore[attr-defined]


def test_a_chunk_whose_worker_dies_is_one_warning(ctx, caplog):
    caplog.set_level(logging.WARNING, logger="pool")
    with pool.ProcessPool(1, mp_context=ctx) as p:
        with pytest.raises(pool.WorkerDied):
            list(p.map(tasks.exit_hard, [5] * 4, chunksize=4))
    assert len(deaths(caplog)) == 1


def test_successes_exceptions_and_timeouts_log_nothing(ctx, caplog):
    caplog.set_level(logging.DEBUG, logger="pool")
    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.square, range(50))) == [i * i for i in range(50)]
        with pytest.raises(ValueError):
            p.submit(tasks.raise_value_error).result(60)
        with pytest.raises(pool.TaskTimeout):
            p.schedule(tasks.sleep_then, (60,), timeout=0.5).result(60)
    assert caplog.records == [], [r.getMessage() for r in caplog.records]


def test_stopping_or_terminating_a_running_task_logs_nothing(ctx, caplog, tmp_path):
    caplog.set_level(logging.DEBUG, logger="pool")
    p = pool.ProcessPool(2, mp_context=ctx)
    first = p.submit(tasks.hang, str(tmp_path))
    assert wait_until(lambda: tasks.announced_pids(str(tmp_path)), 60)
    assert first.stop()
    assert wait_until(first.cancelled, 60)
    # Started, not only sent: a call its worker has not read when the workers are ended
    # never began, and ends cancelled (seen once under spawn on a loaded machine).
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = p.submit(tasks.hang, str(second_dir))
    assert wait_until(lambda: tasks.announced_pids(str(second_dir)), 60)
    p.terminate_workers()
    assert isinstance(second.exception(60), pool.WorkerTerminated)
    assert deaths(caplog) == [] and caplog.records == [], [r.getMessage() for r in caplog.records]

"""``ProcessPool.stats()``: exact counts under deaths, timeouts, cancels, stops and chunks;
per live worker its pid, tasks run, current task and memory; and ``idle_timeout``."""

from __future__ import annotations

import os
import threading

import pytest

import pool
from pool import _platform
import tasks
from helpers import process_exists, wait_until


def total(stats: pool.PoolStats) -> int:
    return (stats.queued + stats.running + stats.completed + stats.failed + stats.cancelled
            + stats.stopped + stats.timed_out)


def test_a_new_pool_counts_nothing(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        stats = p.stats()
        assert stats.submitted == total(stats) == 0
        assert stats.workers == () and stats.workers_started == 0
        assert repr(stats) == "<PoolStats 0 running, 0 queued, 0 completed; 0 workers (0 started)>"


def test_counts_are_exact_through_deaths_timeouts_chunks_cancels_and_stops(ctx, tmp_path):
    gate = str(tmp_path / "gate")
    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.square, range(20), chunksize=5)) == [i * i for i in range(20)]
        with pytest.raises(ValueError):
            p.submit(tasks.raise_value_error).result(60)
        with pytest.raises(pool.WorkerDied):
            p.submit(tasks.exit_hard, 3).result(60)
        with pytest.raises(pool.WorkerDied):
            p.submit(tasks.sigkill_self).result(60)
        with pytest.raises(pool.TaskTimeout):
            p.schedule(tasks.sleep_then, (60,), timeout=0.5).result(60)
        # A call that cannot be pickled never reaches the pool: not counted.
        unpicklable = p.submit(tasks.identity, lambda_holder())
        assert isinstance(unpicklable.exception(60), pool.ArgumentPicklingError)
        stats = p.stats()
        assert (stats.submitted, stats.completed, stats.failed, stats.timed_out) == (8, 4, 3, 1)
        assert stats.queued == stats.running == stats.cancelled == stats.stopped == 0
        assert stats.worker_deaths == 2  # the timeout's worker was ended by the pool
        assert dict(stats.deaths_by_cause) == {"exit code 3": 1, "SIGKILL": 1}

        # Both workers busy; three more wait; one of those is cancelled, one stopped.
        blocked = [p.submit(tasks.announce_then_wait, str(tmp_path), gate, i) for i in range(2)]
        assert wait_until(lambda: len(tasks.announced_pids(str(tmp_path))) == 2, 60)
        waiting = [p.submit(tasks.square, i) for i in range(3)]
        assert waiting[0].cancel()
        assert waiting[1].stop()
        stats = p.stats()  # exact at once: no waiting for the pool to notice
        assert (stats.running, stats.queued, stats.cancelled) == (2, 1, 2)
        assert stats.submitted == total(stats) == 13
        busy = {w.pid: w for w in stats.workers}
        assert set(busy) == tasks.announced_pids(str(tmp_path))
        running_ids = {w.current_task.task_id for w in stats.workers if w.current_task}
        assert running_ids == {f._task_id for f in blocked}
        for worker in stats.workers:
            assert worker.running_for is not None and worker.running_for >= 0
            if _platform.PROC:
                assert worker.rss is not None and worker.rss > 1 << 20
            else:
                assert worker.rss is None

        # Stopping a running task kills its worker: stopped, not a death.
        assert blocked[0].stop()
        assert wait_until(lambda: p.stats().stopped == 1, 60)
        open(gate, "w").close()
        assert blocked[1].result(60) == 1 and waiting[2].result(60) == 4
        stats = p.stats()
        assert (stats.submitted, stats.completed, stats.failed, stats.timed_out,
                stats.cancelled, stats.stopped) == (13, 6, 3, 1, 2, 1)
        assert stats.queued == stats.running == 0 and stats.worker_deaths == 2
        # 2 at first, and one each for the exit, the SIGKILL, the timeout and the stop
        assert stats.workers_started == 6
        assert sum(w.tasks_run for w in stats.workers) <= stats.completed + stats.failed
    final = p.stats()
    assert final.workers == () and final.submitted == total(final) == 13


def lambda_holder() -> object:
    return threading.Lock()  # neither pickle nor cloudpickle can send it


def test_a_chunk_counts_as_one_task_whatever_happens_to_it(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        with pytest.raises(pool.WorkerDied):
            list(p.map(tasks.exit_hard, [5] * 8, chunksize=4))
        stats = p.stats()
    # The first chunk died; the second was cancelled when map's iterator was closed (or
    # had already run: it is counted once, whichever happened).
    assert stats.failed == 1 and stats.worker_deaths == 1
    assert stats.submitted == total(stats) == 2


def test_shutdown_cancel_futures_and_terminate_are_counted(ctx, tmp_path):
    gate = str(tmp_path / "gate")
    p = pool.ProcessPool(1, mp_context=ctx)
    running = p.submit(tasks.announce_then_wait, str(tmp_path), gate)
    queued = [p.submit(tasks.square, i) for i in range(4)]
    assert wait_until(lambda: tasks.announced_pids(str(tmp_path)), 60)
    p.terminate_workers()
    with pytest.raises(pool.WorkerTerminated):
        running.result(60)
    assert all(f.cancelled() for f in queued)
    stats = p.stats()
    assert (stats.submitted, stats.stopped, stats.cancelled) == (5, 1, 4)
    assert stats.worker_deaths == 0 and stats.workers == ()


def test_a_worker_that_dies_idle_is_a_death_with_its_cause(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        pid = p.submit(tasks.pid_of_worker).result(60)
        os.kill(pid, 9)
        assert wait_until(lambda: p.stats().worker_deaths == 1, 60)
        assert dict(p.stats().deaths_by_cause) == {"SIGKILL": 1}
        assert p.submit(tasks.square, 3).result(60) == 9


def test_repr_is_short_and_names_what_happened(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        with pytest.raises(pool.WorkerDied):
            p.submit(tasks.sigkill_self).result(60)
        p.submit(tasks.square, 2).result(60)
        text = repr(p.stats())
    assert text.startswith("<PoolStats 0 running, 0 queued, 1 completed, 1 failed; ")
    assert "(2 started, 1 died: SIGKILL x1)>" in text


@pytest.mark.parametrize("start_method", ["forkserver"])
def test_idle_workers_exit_after_idle_timeout_and_new_work_starts_them(ctx):
    with pool.ProcessPool(2, mp_context=ctx, idle_timeout=0.2) as p:
        pids = set(p.map(tasks.pid_of_worker, range(2)))
        assert wait_until(lambda: p.stats().workers == (), 60)
        assert not any(process_exists(pid) for pid in pids)
        assert p.stats().worker_deaths == 0  # asked to go: not deaths
        assert p.submit(tasks.square, 5).result(60) == 25
        assert p.stats().workers_started >= 2


def test_idle_timeout_is_checked():
    with pytest.raises(ValueError):
        pool.ProcessPool(1, idle_timeout=0)
    with pytest.raises(TypeError):
        pool.ProcessPool(1, idle_timeout="1")  # type: ignore[arg-type]


def test_a_snapshot_pickles_and_converts_to_a_dict(ctx):
    import dataclasses
    import pickle
    with pool.ProcessPool(1, mp_context=ctx) as p:
        with pytest.raises(pool.WorkerDied):
            p.submit(tasks.sigkill_self).result(60)
        p.submit(tasks.square, 2).result(60)
        stats = p.stats()
    assert pickle.loads(pickle.dumps(stats)) == stats
    as_dict = dataclasses.asdict(stats)
    assert as_dict["deaths_by_cause"] == {"SIGKILL": 1} and as_dict["completed"] == 1
    assert isinstance(as_dict["workers"], tuple)


@pytest.mark.skipif(not (_platform.PACKET_PIPES and _platform.PROC),
                    reason="tasks wait in a worker's pipe on Linux (pool._platform)")
def test_tasks_taken_back_from_a_pipe_then_cancelled_by_shutdown_end_cancelled(ctx):
    # Small tasks sent ahead behind a long one are marked running; once the pool has taken
    # them back (the long one ran 5 ms), shutdown's cancel_futures cancels them: they end
    # cancelled (they used to stay running for good) and count as cancelled.
    p = pool.ProcessPool(1, mp_context=ctx)
    for attempt in range(5):  # until they were sent ahead (a loaded machine may not)
        for i in range(20):  # short tasks: the worker gets small ones queued in its pipe
            p.submit(tasks.square, i).result(60)
        long = p.submit(tasks.sleep_then, 2.0)
        behind = [p.submit(tasks.square, i) for i in range(4)]
        if wait_until(lambda: all(f.running() for f in behind), 1):
            break
        long.result(60), [f.result(60) for f in behind]
    else:
        pytest.fail("small tasks were never sent ahead behind a long one")
    assert wait_until(lambda: p._dispatcher.snapshot()[1] == (4, 1), 60)  # back in queue
    p.shutdown(wait=True, cancel_futures=True)
    assert all(f.cancelled() for f in behind) and long.result(0) is None
    stats = p.stats()
    assert (stats.cancelled, stats.stopped) == (4, 0)
    assert stats.submitted == total(stats) == stats.completed + 4

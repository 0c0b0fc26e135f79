"""Ending workers on purpose: terminate_workers / kill_workers with escalation, process
groups on every path, workers that ignore SIGTERM or cannot be reaped, memory limits."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import signal
import threading

import pytest

import pool
import tasks
from helpers import START_METHODS, process_exists, run_script, wait_until


def grandchildren(pid_dir) -> set[int]:
    return tasks.announced_pids(os.path.join(pid_dir, "children"))


@pytest.mark.isolated
@pytest.mark.parametrize("how", ["terminate_workers", "kill_workers"])
def test_ending_the_workers_fails_running_tasks_cancels_queued_and_reaps_groups(
        ctx, tmp_path, how):
    pid_dir = str(tmp_path)
    p = pool.ProcessPool(2, mp_context=ctx)
    running = [p.submit(tasks.start_subprocess_then_hang, pid_dir) for _ in range(2)]
    queued = [p.submit(tasks.square, i) for i in range(3)]
    assert wait_until(lambda: len(tasks.announced_pids(pid_dir)) == 2, 60)
    workers, children = tasks.announced_pids(pid_dir), grandchildren(pid_dir)
    woken = []
    blocked = threading.Thread(target=lambda: woken.append(running[0].exception()))
    blocked.start()  # a thread waiting in result() wakes up with the error
    getattr(p, how)()
    blocked.join(30)
    assert len(woken) == 1 and isinstance(woken[0], pool.WorkerTerminated)
    # Returned only once every worker and every member of its group is gone.
    assert not any(process_exists(pid) for pid in workers | children)
    for future in running:
        error = future.exception(0)
        assert isinstance(error, pool.WorkerTerminated)
        assert isinstance(error, cf.process.BrokenProcessPool)
        assert error.pid in workers
        expected = signal.SIGTERM if how == "terminate_workers" else signal.SIGKILL
        assert error.exitcode == -expected and "when the pool ended its workers" in str(error)
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError):
        p.submit(tasks.square, 1)
    p.shutdown()  # harmless afterwards


@pytest.mark.isolated
def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(ctx, tmp_path):
    pid_dir = str(tmp_path)
    p = pool.ProcessPool(1, mp_context=ctx, terminate_grace=0.3)
    future = p.submit(tasks.ignore_sigterm_then_hang, pid_dir)
    assert wait_until(lambda: tasks.announced_pids(pid_dir), 60)
    (pid,) = tasks.announced_pids(pid_dir)
    p.terminate_workers()
    assert not process_exists(pid)
    assert future.exception(0).exitcode == -signal.SIGKILL


@pytest.mark.isolated
def test_a_worker_that_cannot_be_reaped_is_reported_and_its_slot_refilled(
        ctx, tmp_path, caplog, monkeypatch):
    # Stand-in for a process stuck in the kernel: the pool's SIGKILLs never reach it.
    from pool._worker import teardown as _teardown, handle as _worker_handle
    caplog.set_level(logging.ERROR, logger="pool")
    pid_dir = str(tmp_path)
    p = pool.ProcessPool(1, mp_context=ctx, kill_grace=0.3)
    stuck = p.submit(tasks.hang, pid_dir)
    assert wait_until(lambda: tasks.announced_pids(pid_dir), 60)
    (pid,) = tasks.announced_pids(pid_dir)
    real = _teardown.signal_worker
    monkeypatch.setattr(_worker_handle._teardown, "signal_worker",
                        lambda target, signum: None if target == pid else real(target, signum))
    try:
        assert stuck.stop()
        assert wait_until(stuck.cancelled, 30)  # resolved although the process lives on
        assert any(f"worker pid {pid} is still alive" in r.getMessage() for r in caplog.records)
        assert p.submit(tasks.pid_of_worker).result(60) != pid  # a new worker took the slot
        p.shutdown()
        assert any(f"worker pid {pid} was never confirmed gone" in r.getMessage()
                   for r in caplog.records)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            # Already gone: once the pool is shut down, its lifeline's hang-up makes the
            # worker kill itself, which the stand-in's suppressed signals do not prevent
            # (a forkserver child is reaped by the forkserver, not by us).
            assert ctx.get_start_method() == "forkserver"
        else:
            os.waitpid(pid, 0) if ctx.get_start_method() != "forkserver" else None


PROCESS_TREES = '''
from concurrent.futures import CancelledError
results = {}
def run(name, make, end):
    pid_dir = os.path.abspath(name)
    os.makedirs(os.path.join(pid_dir, "children"))
    p = pool.ProcessPool(1, mp_context=CTX, terminate_grace=0.3)
    future = make(p, pid_dir)
    helpers.wait_until(lambda: tasks.announced_pids(os.path.join(pid_dir, "children"))
                       and tasks.announced_pids(pid_dir), 60)
    kids = tasks.announced_pids(os.path.join(pid_dir, "children"))
    worker = tasks.announced_pids(pid_dir)
    end(p, future, worker)
    try:
        future.result(60)
        outcome = "ok"
    except BaseException as exc:
        outcome = type(exc).__name__
    p.shutdown()
    # shutdown() returned: every member of every worker group is confirmed gone.
    results[name] = [outcome, [helpers.process_exists(pid) for pid in kids | worker]]
hanging = lambda p, d: p.submit(tasks.start_subprocess_then_hang, d)
run("death", hanging, lambda p, f, w: os.kill(next(iter(w)), signal.SIGKILL))
run("timeout", lambda p, d: p.schedule(tasks.start_subprocess_then_hang, (d,), timeout=1),
    lambda p, f, w: None)
run("stop", hanging, lambda p, f, w: f.stop())
run("terminate", hanging, lambda p, f, w: p.terminate_workers(wait=False))
run("kill", hanging, lambda p, f, w: p.kill_workers(wait=False))
run("sigterm ignored", lambda p, d: p.submit(tasks.start_subprocess_then_hang, d, True),
    lambda p, f, w: p.terminate_workers(wait=False))
run("shutdown", lambda p, d: p.submit(tasks.start_subprocess_then_return, d),
    lambda p, f, w: None)
report(results=results)
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_every_way_a_worker_ends_ends_its_process_group(method, tmp_path):
    facts, _ = run_script(PROCESS_TREES, method, tmp_path, timeout=100)
    assert facts["results"] == {
        "death": ["WorkerDied", [False, False]],
        "timeout": ["TaskTimeout", [False, False]],
        "stop": ["CancelledError", [False, False]],
        "terminate": ["WorkerTerminated", [False, False]],
        "kill": ["WorkerTerminated", [False, False]],
        "sigterm ignored": ["WorkerTerminated", [False, False]],
        "shutdown": ["ok", [False, False]],
    }
    assert facts["children_left"] == [] and facts["threads_left"] == []


@pytest.mark.isolated
def test_a_worker_above_max_memory_is_replaced_after_its_task(ctx):
    with pool.ProcessPool(1, mp_context=ctx, max_memory_per_child=150 * 1024 * 1024) as p:
        small = p.submit(tasks.allocate_and_keep, 10).result(60)
        assert p.submit(tasks.pid_of_worker).result(60) == small  # under the limit: kept
        big = p.submit(tasks.allocate_and_keep, 200).result(60)   # the reply still arrives
        assert big == small
        assert p.submit(tasks.pid_of_worker).result(60) != big    # then it was replaced
        assert wait_until(lambda: not process_exists(big), 10)


def test_max_memory_per_child_is_checked_at_the_call_site():
    with pytest.raises(ValueError):
        pool.ProcessPool(1, max_memory_per_child=0)
    with pytest.raises(TypeError):
        pool.ProcessPool(1, max_memory_per_child=1.5)


@pytest.mark.isolated
@pytest.mark.parametrize("dies_in_time", [True, False])
def test_shutdown_waits_for_a_slow_dying_group_member_or_reports_it(
        ctx, monkeypatch, caplog, dies_in_time):
    # Stand-in for a member of a worker's group that takes a while to die after SIGKILL
    # (a huge process freeing its memory, or one stuck in the kernel).
    from pool._worker import teardown
    caplog.set_level(logging.ERROR, logger="pool")
    checks = []
    lingering_pid = 999_999_999

    def members(pgid):
        checks.append(pgid)
        return [lingering_pid] if not dies_in_time or len(checks) < 20 else []

    # The worker's handle and the dispatcher's reaper both look it up in the module.
    monkeypatch.setattr(teardown, "live_group_members", members)
    p = pool.ProcessPool(1, mp_context=ctx, kill_grace=0.5)
    assert p.submit(tasks.square, 3).result(60) == 9
    p.shutdown()
    if dies_in_time:
        assert len(checks) == 20  # shutdown returned only once the group was empty
        assert not caplog.records
    else:
        assert any(f"processes [{lingering_pid}]" in r.getMessage() and "giving up" in
                   r.getMessage() for r in caplog.records)

"""Workers stopped by SIGSTOP (a debugger, a cgroup freezer, ``kill -STOP``): the pool
still ends them, still times their tasks out, and does not wait on one that stopped idle.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import pytest

import pool
import tasks
from pool import _platform
from helpers import process_exists, wait_until

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP")
                                or not os.path.exists("/proc/self/stat"),
                                reason="POSIX signals, and /proc to see a process stopped")


def stop(pid: int) -> None:
    """SIGSTOP, then wait until the kernel shows the process stopped: until it is, an idle
    worker may still wake for a call just written and read it (it then counts as started,
    and stays so until SIGCONT)."""
    os.kill(pid, signal.SIGSTOP)
    assert wait_until(lambda: state_of(pid) in ("T", "t"), 10), state_of(pid)


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    return text[text.rindex(")") + 2]


def running_worker(p: pool.ProcessPool) -> int:
    assert wait_until(lambda: p.stats().running == 1, 30)
    return next(w.pid for w in p.stats().workers if w.current_task is not None)


def two_idle_workers(p: pool.ProcessPool) -> list[int]:
    first, second = (p.submit(tasks.sleep_then, 0.3, i) for i in range(2))
    assert (first.result(60), second.result(60)) == (0, 1)
    return sorted(w.pid for w in p.stats().workers)


def test_the_timeout_of_a_task_whose_worker_is_stopped_still_fires(ctx):
    # The worker must be stopped before its timeout fires, or it writes its stack as any
    # worker does: seeing it run, stopping it and seeing it stopped took over 0.5 s once
    # with two suites running at once (CI), so the timeout leaves room for that.
    timeout = 3.0
    with pool.ProcessPool(1, mp_context=ctx) as p:
        started = time.monotonic()
        future = p.schedule(tasks.sleep_then, (60,), timeout=timeout)
        worker = running_worker(p)
        stop(worker)
        assert time.monotonic() - started < timeout, "stopped too late to test anything"
        error = future.exception(60)
        assert isinstance(error, pool.TaskTimeout)
        assert "did not write its stack" in str(error)  # a stopped process cannot
        assert wait_until(lambda: not process_exists(worker), 10)
        assert p.submit(tasks.square, 3).result(60) == 9


def test_stop_ends_a_stopped_worker(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        future = p.submit(tasks.sleep_then, 60)
        worker = running_worker(p)
        stop(worker)
        future.stop()
        with pytest.raises(concurrent.futures.CancelledError):
            future.result(60)
        assert wait_until(lambda: not process_exists(worker), 10)
        assert p.submit(tasks.square, 3).result(60) == 9


def test_terminate_workers_and_shutdown_end_stopped_workers(ctx):
    p = pool.ProcessPool(2, mp_context=ctx)
    workers = two_idle_workers(p)
    running = p.submit(tasks.sleep_then, 60)
    busy = running_worker(p)
    for worker in workers:
        stop(worker)  # one running, one idle
    p.terminate_workers()  # returns once both are confirmed gone
    assert not any(process_exists(worker) for worker in workers)
    # (Terminated while running; or, if it was stopped before it had read the task,
    # cancelled: the task never started.)
    assert busy in workers and running.done()
    assert running.cancelled() or isinstance(running.exception(0), pool.WorkerTerminated)
    p.shutdown()


def test_shutdown_ends_a_worker_stopped_while_idle(ctx):
    p = pool.ProcessPool(2, mp_context=ctx)
    stopped = two_idle_workers(p)[0]
    stop(stopped)
    started = time.monotonic()
    p.shutdown()  # it cannot read its end of file: the escalation ends it
    assert not process_exists(stopped)
    assert time.monotonic() - started < 30


# A task sent to a worker that then stopped is taken back from a packet-mode pipe (Linux).
# Elsewhere, and under POOL_PORTABLE, it waits for that worker to continue, or to be ended.
@pytest.mark.skipif(not (_platform.PACKET_PIPES and _platform.PROC),
                    reason="taking a task back from a pipe needs packet mode (pool._platform)")
def test_a_worker_stopped_while_idle_holds_up_no_task(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        stopped, other = two_idle_workers(p)
        stop(stopped)
        # The first of these may be sent to the stopped worker: it is taken back unread
        # and run by the other; the rest go to the other at once.
        results = [p.submit(tasks.pid_of_worker).result(30) for _ in range(10)]
        assert set(results) == {other}
        assert p.stats().completed == 12 and p.stats().worker_deaths == 0
        os.kill(stopped, signal.SIGCONT)  # continued: it is sent tasks again, a while later
        assert wait_until(lambda: p.submit(tasks.pid_of_worker).result(30) == stopped, 30)

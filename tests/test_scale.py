"""Hundreds of workers on a small machine: the same guarantees with more descriptors than
``select()`` could watch (the dispatcher waits with ``poll`` through
``multiprocessing.connection.wait``)."""

from __future__ import annotations

import os
import resource
import signal

import pytest

import pool
import tasks
from helpers import START_METHODS, full_volume, open_fds, process_exists, wait_until

WORKERS = 256
DESCRIPTORS = WORKERS * 8 + 256


@pytest.mark.isolated
# (Only where this Python runs the method's volume tests in full: helpers.full_volume. A
# smaller pool would not show what it is for, more descriptors than select() watches.)
@pytest.mark.parametrize("start_method", [
    pytest.param(method, marks=pytest.mark.skipif(
        not full_volume(method), reason="in full on another Python (helpers.full_volume)"))
    for method in START_METHODS])
@pytest.mark.timeout(600)
def test_a_pool_of_256_workers_starts_runs_loses_workers_and_shuts_down(start_method,
                                                                        tmp_path):
    import multiprocessing
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < DESCRIPTORS:
        if hard != resource.RLIM_INFINITY and hard < DESCRIPTORS:
            pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, hard))
    ctx = multiprocessing.get_context(start_method)
    p = pool.ProcessPool(WORKERS, mp_context=ctx)
    futures = [p.submit(tasks.started_then, str(tmp_path), i, "wait") for i in range(WORKERS)]
    assert wait_until(lambda: len(tasks.started_inputs(str(tmp_path))) == WORKERS, 300)
    workers = {w.pid for w in p.stats().workers}
    assert len(workers) == WORKERS and p.stats().running == WORKERS
    assert max(open_fds()) > 1024  # beyond what select() can watch
    victims = sorted(workers)[:10]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: p.stats().worker_deaths == len(victims), 60)
    (tmp_path / "gate").touch()
    errors = [f.exception(120) for f in futures]
    died = {e.pid for e in errors if isinstance(e, pool.WorkerDied)}
    assert died == set(victims)  # exactly the tasks of the killed workers failed
    assert sum(e is None for e in errors) == WORKERS - len(victims)
    assert wait_until(lambda: len(p.stats().workers) == WORKERS, 120)  # refilled
    assert [p.submit(tasks.square, i).result(60) for i in range(5)] == [0, 1, 4, 9, 16]
    everyone = workers | {w.pid for w in p.stats().workers}
    p.shutdown()
    assert not any(process_exists(pid) for pid in everyone)

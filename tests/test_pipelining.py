"""Small tasks queued in a worker's pipe behind the running one: whatever the running one
does (hang, die, overrun its timeout, get stopped), the ones behind it run, once each.
And a large call never blocks the dispatcher, even when the worker stops reading it."""

from __future__ import annotations

import os
import threading

import pytest

import pool
import tasks
from helpers import wait_until

SMALL = 30


def warm(p: pool.ProcessPool) -> set[int]:
    """Run a burst of small tasks, so that both workers are up and known to be quick (small
    tasks are queued behind the running one only on such workers); their pids."""
    return set(p.map(tasks.pid_of_worker, range(200)))


@pytest.mark.isolated
def test_tasks_queued_behind_one_that_hangs_run_on_the_other_worker(ctx, tmp_path):
    release = str(tmp_path / "release")
    with pool.ProcessPool(2, mp_context=ctx) as p:
        warm(p)
        hung = p.submit(tasks.wait_for_file, release, "released", 60)
        small = [p.submit(tasks.pid_of_worker) for _ in range(SMALL)]
        ran_on = {f.result(30) for f in small}  # while the first still hangs
        assert not hung.done() and len(ran_on) == 1
        open(release, "w").close()
        assert hung.result(30) == "released"


@pytest.mark.isolated
def test_a_death_fails_only_the_running_task_not_those_queued_behind_it(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        before = warm(p)
        dying = p.submit(tasks.sigkill_self)
        small = [p.submit(tasks.square, i) for i in range(SMALL)]
        assert [f.result(30) for f in small] == [i * i for i in range(SMALL)]
        error = dying.exception(30)
        assert isinstance(error, pool.WorkerDied) and error.pid in before


@pytest.mark.isolated
def test_a_timeout_fails_only_the_running_task_not_those_queued_behind_it(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        warm(p)
        slow = p.schedule(tasks.sleep_then, (60,), timeout=0.5)
        small = [p.submit(tasks.square, i) for i in range(SMALL)]
        assert [f.result(30) for f in small] == [i * i for i in range(SMALL)]
        assert isinstance(slow.exception(30), pool.TaskTimeout)


@pytest.mark.isolated
def test_stopping_a_task_queued_behind_another_cancels_it_and_keeps_the_worker(ctx, tmp_path):
    release = str(tmp_path / "release")
    with pool.ProcessPool(1, mp_context=ctx) as p:
        (pid,) = warm(p)
        hung = p.submit(tasks.wait_for_file, release, "released", 60)
        small = [p.submit(tasks.square, i) for i in range(SMALL)]
        # Sent behind the hung task or still in the pool's queue: either way it ends
        # cancelled (taken back from the pipe, or never sent), and it never runs.
        assert small[3].stop()
        assert wait_until(small[3].cancelled, 30)
        open(release, "w").close()
        assert hung.result(30) == "released"
        assert [f.result(30) for f in small if f is not small[3]] == [
            i * i for i in range(SMALL) if i != 3]
        assert p.submit(tasks.pid_of_worker).result(30) == pid  # never killed


@pytest.mark.isolated
def test_a_large_call_whose_unpickling_hangs_blocks_nothing_but_itself(ctx):
    # The worker stops reading in the middle of the call (a reducer hangs), with megabytes
    # of it still to come: the dispatcher must go on serving the other worker and the clock.
    call = (b"a" * (4 << 20), tasks.UnpickleBomb("hang", os.getpid()), b"b" * (8 << 20))
    with pool.ProcessPool(2, mp_context=ctx) as p:
        warm(p)
        stuck = p.schedule(tasks.take_argument, (call,), timeout=2)
        small = [p.submit(tasks.square, i) for i in range(SMALL)]
        assert [f.result(30) for f in small] == [i * i for i in range(SMALL)]
        assert not stuck.done()
        error = stuck.exception(30)
        assert isinstance(error, pool.TaskTimeout) and "_detonate_on_unpickle" in error.stack
        assert p.submit(tasks.square, 7).result(30) == 49


@pytest.mark.isolated
def test_large_calls_and_results_in_a_row_arrive_intact_between_small_ones(ctx):
    blobs = [os.urandom(n) for n in (1 << 20, 5 << 20, 100, 3 << 20, 70 << 10)]
    with pool.ProcessPool(2, mp_context=ctx) as p:
        futures = [(p.submit(tasks.identity, blob), p.submit(tasks.square, i))
                   for i, blob in enumerate(blobs)]
        for i, (big, small) in enumerate(futures):
            assert big.result(60) == blobs[i] and small.result(60) == i * i


@pytest.mark.isolated
def test_tasks_taken_back_while_the_worker_reads_run_exactly_once(ctx, tmp_path):
    # A thread that never lets go of the GIL makes the dispatcher's turns slow (it gets the
    # GIL every 5 ms), so tasks are taken back just after they were sent, while the worker
    # is reading them; every 40th task also runs long. Each must run once, every future
    # must resolve, whichever of the parent and the worker got each frame.
    n = 1500
    stop = threading.Event()

    def hog_the_gil() -> None:
        while not stop.is_set():
            sum(range(1000))

    hog = threading.Thread(target=hog_the_gil)
    hog.start()
    try:
        with pool.ProcessPool(2, mp_context=ctx) as p:
            warm(p)
            futures = [p.submit(tasks.run_once, str(tmp_path), i, 0.02 if i % 40 == 0 else 0)
                       for i in range(n)]
            assert [f.result(60) for f in futures] == list(range(n))
    finally:
        stop.set()
        hog.join()
    assert len(os.listdir(tmp_path)) == n


@pytest.mark.isolated
def test_without_packet_pipes_one_task_at_a_time_and_all_the_rest_holds(ctx, tmp_path,
                                                                         monkeypatch):
    # What runs where pipes have no packet mode (not Linux), or a user is over their
    # pipe-page limit: no tasks wait behind a running one, and nothing else changes.
    from pool._wire import limits as _limits
    monkeypatch.setattr(_limits, "PACKET_PIPE_BYTES", 1 << 40)
    release = str(tmp_path / "release")
    blob = os.urandom(3 << 20)
    with pool.ProcessPool(2, mp_context=ctx) as p:
        warm(p)
        assert all(w.reclaim_fd is None for w in p._dispatcher._loop._workers.values())
        hung = p.submit(tasks.wait_for_file, release, "released", 60)
        dying = p.submit(tasks.sigkill_self)
        small = [p.submit(tasks.square, i) for i in range(SMALL)]
        assert [f.result(30) for f in small] == [i * i for i in range(SMALL)]
        assert isinstance(dying.exception(30), pool.WorkerDied)
        assert p.submit(tasks.identity, blob).result(60) == blob
        open(release, "w").close()
        assert hung.result(30) == "released"


def test_a_pipeline_depth_that_could_block_the_dispatcher_is_refused():
    """_limits' rule 2: every packet that may wait in a task pipe fits in it, so the
    dispatcher's writes never block; a depth that breaks it never gets a dispatcher."""
    from pool._wire import limits as _limits
    from pool._dispatcher.front import Dispatcher
    import multiprocessing
    most = _limits.PACKET_PIPE_BYTES // _limits.PIPE_BUF
    assert _limits.PIPELINE_DEPTH <= most
    for depth in (most + 1, 0):
        with pytest.raises(ValueError, match="pipeline depth"):
            Dispatcher(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                       initializer=None, max_tasks_per_child=None, pipeline_depth=depth)
    _limits.check_pipeline(most)  # the largest that fits is allowed


def test_a_frame_larger_than_a_small_pipe_goes_to_a_writer_thread():
    """_limits' rule 3: a frame the dispatcher writes itself fits in the (empty) pipe,
    also in a pipe smaller than usual (a user over pipe-user-pages-soft gets 4 KiB)."""
    from pool._wire import limits as _limits
    assert _limits.background_above(None) == _limits.BACKGROUND_FRAME_BYTES
    assert _limits.background_above(1 << 20) == _limits.BACKGROUND_FRAME_BYTES
    assert _limits.background_above(4096) == 4096

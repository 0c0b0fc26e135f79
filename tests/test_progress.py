"""``map(..., progress=obj)`` and ``pool.as_completed(fs, progress=obj)``: item counts (not
chunks) reach ``obj.update(n)`` or a plain callable, on a thread of their own; a progress
object that blocks delays no result; one that raises is logged and dropped."""

from __future__ import annotations

import concurrent.futures
import logging
import threading

import pytest

import pool
import tasks
from helpers import wait_until


class Recorder:
    """A progress object that records what it was told, and on which thread."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.counts: list[int] = []
        self.threads: set[str] = set()
        self.gate = gate

    def update(self, n: int) -> None:
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            assert self.gate.wait(60)
        self.counts.append(n)


def progress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pool-progress"]


@pytest.mark.parametrize("chunksize", [1, 7])
def test_map_counts_items_not_chunks_and_is_complete_when_the_loop_ends(ctx, chunksize):
    bar = Recorder()
    with pool.ProcessPool(2, mp_context=ctx) as p:
        results = list(p.map(tasks.square, range(100), chunksize=chunksize, progress=bar))
        assert results == [i * i for i in range(100)]
        assert sum(bar.counts) == 100  # all there once the loop is over: no waiting
    assert bar.threads == {"pool-progress"}  # never the caller's, never the pool's thread
    assert not progress_threads()


def test_a_plain_callable_works_and_several_iterables_count_items(ctx):
    seen: list[int] = []
    with pool.ProcessPool(2, mp_context=ctx) as p:
        out = list(p.map(tasks.add, range(30), range(30), chunksize=4, progress=seen.append))
    assert out == [2 * i for i in range(30)] and sum(seen) == 30


def test_a_blocked_progress_object_delays_no_result(ctx):
    gate = threading.Event()
    bar = Recorder(gate)
    with pool.ProcessPool(2, mp_context=ctx) as p:
        results = p.map(tasks.square, range(50), progress=bar)
        # Every result arrives while the progress object is stuck in its first update.
        assert [next(results) for _ in range(50)] == [i * i for i in range(50)]
        assert p.submit(tasks.square, 9).result(60) == 81  # nor does any other task wait
        assert bar.counts == []
        gate.set()
        assert list(results) == []  # the end of the loop: every count delivered
        assert sum(bar.counts) == 50


def test_failed_dead_and_timed_out_tasks_count_and_cancelled_ones_do_not(ctx, tmp_path):
    bar = Recorder()
    gate = str(tmp_path / "gate")
    with pool.ProcessPool(1, mp_context=ctx) as p:
        blocker = p.submit(tasks.announce_then_wait, str(tmp_path), gate)
        assert wait_until(lambda: tasks.announced_pids(str(tmp_path)), 60)
        fs = [p.submit(tasks.square, 2), p.submit(tasks.raise_value_error),
              p.submit(tasks.sigkill_self), p.schedule(tasks.sleep_then, (60,), timeout=0.5),
              p.submit(tasks.square, 3)]
        assert fs[4].cancel()
        open(gate, "w").close()
        done = list(pool.as_completed([blocker, *fs], timeout=60, progress=bar))
        assert len(done) == 6 and fs[4] in done
        assert isinstance(fs[1].exception(), ValueError)
        assert isinstance(fs[2].exception(), pool.WorkerDied)
        assert isinstance(fs[3].exception(), pool.TaskTimeout)
    # the blocker, the square, the exception, the death and the timeout; not the cancelled
    assert sum(bar.counts) == 5


def test_as_completed_works_with_any_futures_and_without_progress():
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        fs = [threads.submit(pow, 2, i) for i in range(10)]
        bar = Recorder()
        assert {f.result() for f in pool.as_completed(fs, progress=bar)} == {2 ** i for i in range(10)}
        assert sum(bar.counts) == 10
        assert set(pool.as_completed(fs)) == set(fs)


def test_a_progress_object_that_raises_is_logged_once_and_dropped(ctx, caplog):
    calls = []

    def broken(n: int) -> None:
        calls.append(n)
        raise RuntimeError("bar is broken")

    caplog.set_level(logging.ERROR, logger="pool")
    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.square, range(40), progress=broken)) == [i * i for i in range(40)]
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "pool: the progress object raised; it is not called again"]


def test_a_bad_progress_object_fails_at_the_call(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        with pytest.raises(TypeError, match="progress must have an update"):
            p.map(tasks.square, range(3), progress=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="progress must have an update"):
            pool.as_completed([], progress=object())  # type: ignore[arg-type]


def test_a_map_left_early_reports_no_more_and_leaves_no_thread(ctx):
    bar = Recorder()
    with pool.ProcessPool(1, mp_context=ctx) as p:
        for result in p.map(tasks.square, range(200), progress=bar):
            break
    assert wait_until(lambda: not progress_threads(), 30)
    assert sum(bar.counts) < 200


def test_tqdm_is_driven_as_it_is():
    tqdm = pytest.importorskip("tqdm").tqdm
    import io
    tqdm.monitor_interval = 0  # no monitor thread of tqdm's own (the leak check counts it)
    out = io.StringIO()
    with pool.ProcessPool(2) as p, tqdm(total=60, file=out, ascii=True) as bar:
        assert list(p.map(tasks.square, range(60), chunksize=8, progress=bar)) == [
            i * i for i in range(60)]
        assert bar.n == 60
    assert "60/60" in out.getvalue()


def test_two_progress_targets_over_the_same_futures_both_count(ctx):
    overall, group = Recorder(), Recorder()
    with pool.ProcessPool(2, mp_context=ctx) as p:
        fs = [p.submit(tasks.sleep_then, 0.05, i) for i in range(10)]
        first = pool.as_completed(fs, timeout=60, progress=overall)
        assert len(list(pool.as_completed(fs, timeout=60, progress=group))) == 10
        assert len(list(first)) == 10
    assert sum(overall.counts) == sum(group.counts) == 10
    assert not progress_threads()

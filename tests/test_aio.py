"""The asyncio surface (``pool/_aio.py``): ``run``, ``amap``, ``as_completed_async`` and
``to_process``. Results and failures arrive where they are awaited; cancelling, or leaving
an ``amap`` loop early, stops what was started (the worker and the processes it started
are gone); a worker's death fails one awaitable; waiting is woken by the futures, so an
idle await costs no CPU."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from itertools import repeat

import pytest

import pool
import tasks
from helpers import Scenario, process_exists
from pool import _shared

EAGER = getattr(asyncio, "eager_task_factory", None)  # 3.12+
needs_eager = pytest.mark.skipif(EAGER is None, reason="asyncio.eager_task_factory is 3.12+")
FACTORIES = ["default", pytest.param("eager", marks=needs_eager)]


async def until(predicate, timeout=10.0):
    """Wait, without blocking the loop, for a fact nothing announces (a file a worker
    wrote, a process gone)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        await asyncio.sleep(0.01)


def gone(pid):
    """``pid`` has exited (a zombie counts as gone)."""
    return not process_exists(pid)


def use_factory(factory):
    if factory == "eager":
        asyncio.get_running_loop().set_task_factory(EAGER)


@contextlib.asynccontextmanager
async def ended_on_failure(p):
    """``async with p``, except that a failing test terminates the workers instead of
    waiting for tasks that wait for a gate the test never opened."""
    async with p:
        try:
            yield p
        except BaseException:
            p.terminate_workers()
            raise


@pytest.fixture
def default_pool():
    """``to_process``'s process-wide pool (the shared pool), shut down after the test (its
    workers would otherwise outlive it, until interpreter exit)."""
    yield
    _shared.discard()


def test_importing_pool_does_not_import_asyncio():
    code = "import sys, pool; assert 'asyncio' not in sys.modules, 'asyncio was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- run ---------------------------------------------------------------------------------------

def test_run_returns_the_result_or_raises_the_tasks_exception():
    async def main():
        async with pool.ProcessPool(2) as p:
            assert await p.run(tasks.square, 7) == 49
            assert await p.run(tasks.add, 1, 2, c=3) == 6
            with pytest.raises(ValueError, match="^boom$"):
                await p.run(tasks.raise_value_error)
    asyncio.run(main())


@pytest.mark.isolated
def test_timeouts_fail_the_task_where_it_is_awaited_and_amap_stops_the_rest(tmp_path):
    directory = str(tmp_path)

    async def main():
        async with pool.ProcessPool(2, task_timeout=0.3) as p:
            with pytest.raises(pool.TaskTimeout):  # the pool's task_timeout by default
                await p.run(tasks.sleep_then, 30)
            assert await p.run(tasks.sleep_then, 0.6, "no limit", timeout=None) == "no limit"
            with pytest.raises(pool.TaskTimeout) as caught:
                await p.run(tasks.sleep_then, 30, timeout=0.5)
            assert caught.value.timeout == 0.5
            got = []
            with pytest.raises(pool.TaskTimeout):
                async for value in p.amap(tasks.sleep_then, [0, 30, 0], ["a", "b", "c"]):
                    got.append(value)
            assert got == ["a"]  # the results before it, then the timeout at its place
        async with ended_on_failure(pool.ProcessPool(2)) as p:
            # Input 1 fails while 2 and 3 run (waiting for the gate) and 4 is queued.
            thens = ["return", "raise", "wait", "wait", "wait"]
            got = []
            with pytest.raises(ValueError):
                async for i in p.amap(tasks.started_then, repeat(directory), range(5), thens):
                    got.append(i)
                    await until(lambda: len(tasks.started_inputs(directory)) == 4)
            assert got == [0]
            started = tasks.started_inputs(directory)
            await until(lambda: gone(started[2]) and gone(started[3]))
            (tmp_path / "gate").touch()
        assert sorted(tasks.started_inputs(directory)) == [0, 1, 2, 3]  # 4 never started
    asyncio.run(main())


# -- cancelling and leaving early --------------------------------------------------------------

@pytest.mark.isolated
def test_cancelling_or_leaving_early_stops_what_was_started(ctx, tmp_path):
    async def main():
        async with ended_on_failure(pool.ProcessPool(1, mp_context=ctx)) as p:
            pids, marks = tmp_path / "run", tmp_path / "marks"
            pids.mkdir()
            marks.mkdir()
            running = asyncio.ensure_future(p.run(tasks.start_subprocess_then_hang, str(pids)))
            queued = asyncio.ensure_future(p.run(tasks.run_once, str(marks), 1))
            await until(lambda: tasks.announced_pids(str(pids)))
            (worker,) = tasks.announced_pids(str(pids))
            (child,) = tasks.announced_pids(str(pids / "children"))
            queued.cancel()
            running.cancel()
            for task in (queued, running):
                with pytest.raises(asyncio.CancelledError):
                    await task
            await until(lambda: gone(worker) and gone(child))
            # The pool carries on; had the queued task not been cancelled, it would have run
            # first.
            assert await p.run(tasks.square, 3) == 9
            assert not os.listdir(marks)

        async with ended_on_failure(pool.ProcessPool(2, mp_context=ctx)) as p:
            for how in ("break", "exception", "aclose", "cancel"):
                # Input 0 returns; 1 and 2 then run (waiting for a gate); 3-5 are queued.
                directory = tmp_path / how
                directory.mkdir()
                args = (repeat(str(directory)), range(6), ["return"] + ["wait"] * 5)

                def three_started():
                    return len(tasks.started_inputs(str(directory))) == 3
                if how == "break":
                    async for _ in p.amap(tasks.started_then, *args):
                        await until(three_started)
                        break
                elif how == "exception":
                    with pytest.raises(KeyError):
                        async for _ in p.amap(tasks.started_then, *args):
                            await until(three_started)
                            raise KeyError(how)
                elif how == "aclose":
                    results = p.amap(tasks.started_then, *args)
                    assert await results.__anext__() == 0
                    await until(three_started)
                    await results.aclose()
                else:
                    async def consume():
                        async for _ in p.amap(tasks.started_then, *args):
                            pass
                    consumer = asyncio.ensure_future(consume())
                    await until(three_started)
                    consumer.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await consumer
                # The two waiting: 1 and 2, or 3 in place of 2 when the worker that
                # returned 0 had 3 sent ahead while 2 waited behind 1 (contract 8 would
                # take 2 back and run it).
                started = tasks.started_inputs(str(directory))
                waiting = [pid for i, pid in started.items() if i != 0]
                await until(lambda: all(gone(pid) for pid in waiting))
                (directory / "gate").touch()
        for how in ("break", "exception", "aclose", "cancel"):  # nothing more ran
            ran = sorted(tasks.started_inputs(str(tmp_path / how)))
            assert len(ran) == 3 and ran[0] == 0 and set(ran) <= {0, 1, 2, 3}, (how, ran)
    asyncio.run(main())


# -- deaths ------------------------------------------------------------------------------------

@pytest.mark.isolated
def test_a_killed_worker_fails_only_its_own_awaitable_with_worker_died(ctx, tmp_path):
    async def main():
        async with pool.ProcessPool(2, mp_context=ctx) as p:
            killed, segfault, exited, *squares = await asyncio.gather(
                p.run(tasks.sigkill_self), p.run(tasks.segfault), p.run(tasks.exit_hard, 3),
                *(p.run(tasks.square, i) for i in range(6)), return_exceptions=True)
            assert isinstance(killed, pool.WorkerDied) and "signal SIGKILL (9)" in str(killed)
            assert isinstance(segfault, pool.WorkerDied) and "signal SIGSEGV (11)" in str(segfault)
            assert isinstance(exited, pool.WorkerDied) and "exit code 3" in str(exited)
            assert squares == [i * i for i in range(6)]
            got = []
            thens = ["return", "return", "segfault", "return"]
            with pytest.raises(pool.WorkerDied, match=r"signal SIGSEGV \(11\)"):
                async for i in p.amap(tasks.started_then, repeat(str(tmp_path)), range(4),
                                      thens):
                    got.append(i)
            assert got == [0, 1]
            assert await p.run(tasks.square, 5) == 25
    asyncio.run(main())


# -- amap --------------------------------------------------------------------------------------

def test_amap_yields_results_in_input_order_or_as_they_finish(tmp_path):
    gate = tmp_path / "gate"

    async def main():
        async with ended_on_failure(pool.ProcessPool(2)) as p:
            assert [x async for x in p.amap(tasks.square, range(20))] == [
                x * x for x in range(20)]
            assert [x async for x in p.amap(tasks.square, range(20), chunksize=3)] == [
                x * x for x in range(20)]
            assert [x async for x in p.amap(tasks.add, [1, 2, 3], [10, 20], chunksize=2)] == [
                11, 22]
            assert [x async for x in p.amap(tasks.square, [])] == []
            # Unordered: the input that waits for the gate comes last.
            results = p.amap(tasks.wait_for_file, [str(gate), os.devnull], ["slow", "fast"],
                             ordered=False)
            assert await asyncio.wait_for(results.__anext__(), 30) == "fast"
            gate.touch()
            assert [x async for x in results] == ["slow"]
            unordered = p.amap(tasks.square, range(20), ordered=False, chunksize=3)
            assert sorted([x async for x in unordered]) == [x * x for x in range(20)]
    asyncio.run(main())


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("chunksize", [1, 2])
def test_amap_reads_its_input_as_it_submits_at_most_buffersize_ahead(ordered, chunksize):
    read = []

    def inputs():
        for i in range(12):
            read.append(i)
            yield i

    async def main():
        async with pool.ProcessPool(2) as p:
            results = p.amap(tasks.square, inputs(), buffersize=3, ordered=ordered,
                             chunksize=chunksize)
            assert read == []  # nothing is read or submitted before the first step
            taken = []
            async for value in results:
                taken.append(value)
                assert len(read) <= (len(taken) + 3) * chunksize  # (a chunk is one task)
            assert sorted(taken) == [i * i for i in range(12)]
            with pytest.raises(ValueError):
                p.amap(tasks.square, [1], buffersize=0)
            with pytest.raises(ValueError):
                p.amap(tasks.square, [1], chunksize=0)
    asyncio.run(main())


@pytest.mark.isolated
@needs_eager
def test_an_amap_consumer_under_the_eager_task_factory(tmp_path):

    async def main():
        use_factory("eager")
        async with ended_on_failure(pool.ProcessPool(2)) as p:
            async def collect(**options):
                return [x async for x in p.amap(tasks.square, range(10), **options)]
            consumer = asyncio.create_task(collect())  # its first step runs right here
            assert await consumer == [x * x for x in range(10)]
            assert sorted(await asyncio.create_task(collect(ordered=False))) == [
                x * x for x in range(10)]
            directory = str(tmp_path)

            async def consume():
                async for _ in p.amap(tasks.started_then, repeat(directory), range(4),
                                      repeat("wait")):
                    pass
            consumer = asyncio.create_task(consume())
            await until(lambda: len(tasks.started_inputs(directory)) == 2)
            consumer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consumer
            started = tasks.started_inputs(directory)
            await until(lambda: gone(started[0]) and gone(started[1]))
            (tmp_path / "gate").touch()
        assert sorted(tasks.started_inputs(directory)) == [0, 1]
    asyncio.run(main())


# -- as_completed_async --------------------------------------------------------------------------

def test_as_completed_async_yields_each_future_once_as_it_finishes(tmp_path):
    gate = tmp_path / "gate"

    async def main():
        async with ended_on_failure(pool.ProcessPool(1)) as p:
            finished: cf.Future[str] = cf.Future()
            finished.set_result("finished")
            plain: cf.Future[str] = cf.Future()  # resolved by another thread
            gated = p.submit(tasks.wait_for_file, str(gate), "pool")
            futures = pool.as_completed_async([gated, plain, finished, finished])
            assert await futures.__anext__() is finished  # those done already come first
            resolver = threading.Thread(target=plain.set_result, args=("plain",))
            resolver.start()
            assert await futures.__anext__() is plain
            resolver.join()
            gate.touch()
            assert await futures.__anext__() is gated
            with pytest.raises(StopAsyncIteration):
                await futures.__anext__()
    asyncio.run(main())


def test_as_completed_async_times_out_and_leaves_the_futures_running(tmp_path):
    gate = tmp_path / "gate"

    async def main():
        async with ended_on_failure(pool.ProcessPool(1)) as p:
            running = p.submit(tasks.wait_for_file, str(gate), "still running")
            done: cf.Future[int] = cf.Future()
            done.set_result(4)
            seen = []
            with pytest.raises(TimeoutError, match=r"^1 \(of 2\) futures unfinished$"):
                async for future in pool.as_completed_async([running, done], timeout=0.3):
                    seen.append(future)
            assert seen == [done]
            assert not running.done()
            gate.touch()
            assert await running == "still running"
            with pytest.raises(TypeError, match="asyncio.as_completed"):
                pool.as_completed_async([asyncio.get_running_loop().create_future()])
    asyncio.run(main())


# -- to_process --------------------------------------------------------------------------------

@pytest.mark.isolated
def test_to_process_runs_on_one_process_wide_pool_and_cancelling_stops_it(tmp_path,
                                                                          default_pool):
    async def main():
        assert await pool.to_process(tasks.add, 1, 2, c=3) == 6
        with pool.shared() as lease:  # the shared pool, as pool.shared() lends it out
            assert await pool.to_process(tasks.pid_of_worker) in lease._pool._processes
        with pytest.raises(ValueError, match="^boom$"):
            await pool.to_process(tasks.raise_value_error)
        call = asyncio.ensure_future(pool.to_process(tasks.hang, str(tmp_path)))
        await until(lambda: tasks.announced_pids(str(tmp_path)))
        (worker,) = tasks.announced_pids(str(tmp_path))
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until(lambda: gone(worker))
        assert await pool.to_process(tasks.square, 4) == 16
    asyncio.run(main())


# -- no polling, no spinning -------------------------------------------------------------------

class CountingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Counts the event loop's turns: each one waits in ``select()`` once."""

    turns = 0

    def select(self, timeout=None):
        self.turns += 1
        return super().select(timeout)


@pytest.mark.parametrize("factory", FACTORIES)
def test_waiting_is_woken_by_the_task_not_polled(factory):
    # A fact check, not a speed test: while a task sleeps 0.5 s, the loop should wait in
    # select() for the wakeup, a few turns and well under a millisecond of CPU; a loop that
    # polled every 10 ms would take 50 turns, one that spun thousands and the whole CPU.
    async def main(selector):
        use_factory(factory)
        async with pool.ProcessPool(2) as p:
            await asyncio.gather(p.run(tasks.sleep_then, 0.2), p.run(tasks.sleep_then, 0.2))
            waits = {
                "run": lambda: p.run(tasks.sleep_then, 0.5),
                "amap": lambda: first(p.amap(tasks.sleep_then, [0.5])),
                "amap unordered": lambda: first(p.amap(tasks.sleep_then, [0.5], ordered=False)),
                "as_completed_async": lambda: first(pool.as_completed_async(
                    [p.submit(tasks.sleep_then, 0.5)])),
            }
            for name, wait in waits.items():
                started, cpu, turns = time.monotonic(), time.process_time(), selector.turns
                await asyncio.create_task(wait())
                took, cpu = time.monotonic() - started, time.process_time() - cpu
                assert took >= 0.5 and selector.turns - turns <= 10 and cpu < 0.05, (
                    name, took, selector.turns - turns, cpu)

    async def first(iterator):
        try:
            return await iterator.__anext__()
        finally:
            await iterator.aclose()

    selector = CountingSelector()
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        runner.run(main(selector))


# An amap left open with a task running when main() ends (asyncio.run's teardown has to
# close it), under the eager task factory where there is one, and to_process's pool left
# for the interpreter's exit to shut down.
SHUTDOWN = '''
import asyncio, atexit, itertools
atexit.register(lambda: print("CPU_AT_EXIT", time.process_time(), flush=True))
directory = os.path.abspath("started")
os.mkdir(directory)
async def main():
    if hasattr(asyncio, "eager_task_factory"):
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
    shared_worker = await pool.to_process(tasks.pid_of_worker)
    p = pool.ProcessPool(1, mp_context=CTX)
    results = p.amap(tasks.started_then, itertools.repeat(directory), range(3),
                     ["return", "wait", "wait"])
    assert await results.__anext__() == 0
    helpers.wait_until(lambda: len(tasks.started_inputs(directory)) == 2, 60)
    print("PIDS", json.dumps([shared_worker, *tasks.started_inputs(directory).values()]),
          flush=True)
    print("CPU_BEFORE", time.process_time(), flush=True)
    return results  # still referenced: only asyncio.run's teardown closes it
asyncio.run(main())
'''


def test_shutdown_closes_what_is_left_open_without_spinning(tmp_path):
    scenario = Scenario(SHUTDOWN, "forkserver", tmp_path)
    try:
        pids = json.loads(scenario.read_until("PIDS"))
        before = float(scenario.read_until("CPU_BEFORE"))
        at_exit = float(scenario.read_until("CPU_AT_EXIT"))
        code, _, _, err = scenario.wait(30)  # the running task waits 60 s if not stopped
    finally:
        scenario.close()
    assert code == 0, err
    assert at_exit - before < 0.2, at_exit - before
    assert all(gone(pid) for pid in pids), [pid for pid in pids if not gone(pid)]

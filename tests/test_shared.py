"""The shared pool (``pool.shared()``): leases, conflicting options, a lease's shutdown, many
threads, fork and interpreter exit."""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import threading
import time

import pytest

import pool
from pool import _shared
from pool._options import usable_cpu_count
import tasks
from helpers import START_METHODS, process_exists, run_script, wait_until

DEFAULT_WORKERS = usable_cpu_count()
LARGE = b"x" * (1 << 20)  # a call this large is not sent ahead: it waits in the pool's queue


@pytest.fixture(autouse=True)
def fresh_shared_pool():
    """Each test starts with no shared pool and leaves none (the leak check runs after)."""
    _shared.discard()
    yield
    _shared.discard()


def running(*futures):
    return wait_until(lambda: all(f.running() or f.done() for f in futures), 60)


def test_leases_share_one_pool():
    first = pool.shared(max_workers=1)
    second = pool.shared()
    third = pool.shared(max_workers=1, task_timeout=None, initargs=[],
                        mp_context=multiprocessing.get_context("forkserver"))
    assert first._pool is second._pool is third._pool
    workers = {lease.submit(tasks.pid_of_worker).result(60) for lease in (first, second, third)}
    assert len(workers) == 1
    assert third.options["max_workers"] == 1
    assert third.options["idle_timeout"] == _shared.IDLE_TIMEOUT
    assert third.options["mp_context"].get_start_method() == "forkserver"
    for lease in (first, second, third):
        lease.shutdown()
    assert pool.shared()._pool is first._pool  # the last lease released: the pool stays


def test_the_pool_outlives_its_last_lease_and_its_idle_workers_exit():
    lease = pool.shared(max_workers=1, idle_timeout=0.2)
    first = lease.submit(tasks.pid_of_worker).result(60)
    lease.shutdown()  # the last lease: the pool stays, and its idle worker leaves
    assert wait_until(lambda: not lease._pool.stats().workers, 30)
    assert wait_until(lambda: not process_exists(first), 30)
    again = pool.shared()
    assert again._pool is lease._pool
    assert again.submit(tasks.pid_of_worker).result(60) != first  # started on demand
    again.shutdown()


def test_other_options_raise_while_leased_and_replace_the_pool_when_not():
    lease = pool.shared(max_workers=1)
    other = pool.shared()
    with pytest.raises(pool.SharedPoolConflict) as raised:
        pool.shared(max_workers=2, task_timeout=5, stop_grace=3.0)
    conflict = raised.value
    assert conflict.differing == {"max_workers": ("1", "2"), "task_timeout": ("None", "5")}
    assert conflict.leases == 2 and isinstance(conflict, RuntimeError)
    assert str(conflict).startswith("pool.shared(max_workers=2, task_timeout=5): the shared "
                                    "pool has max_workers=1, task_timeout=None and 2 leases "
                                    "are out on it")
    assert lease.submit(tasks.square, 3).result(60) == 9  # nothing happened to the pool
    other.shutdown()
    with pytest.raises(pool.SharedPoolConflict, match="1 lease is out"):
        pool.shared(max_workers=2)
    old = lease._pool
    lease.shutdown()
    replaced = pool.shared(max_workers=2)  # no lease out: a pool with these options
    assert replaced._pool is not old and replaced.options["max_workers"] == 2
    old._dispatcher.finished.result(30)  # the old pool ended by itself
    assert replaced.submit(tasks.square, 4).result(60) == 16
    replaced.shutdown()


def test_what_counts_as_the_same_options():
    lease = pool.shared(max_workers=1, initializer=tasks.init_sets, initargs=(1,))
    same = [pool.shared(mp_context=multiprocessing.get_context("forkserver")),  # by method
            pool.shared(initializer=tasks.init_sets, initargs=[1], max_workers=None
                        if DEFAULT_WORKERS == 1 else 1)]
    for asked, differing in [({"mp_context": multiprocessing.get_context("spawn")},
                              ("'forkserver'", "'spawn'")),
                             ({"initializer": lambda value: None},  # not the same function
                              ("tasks.init_sets", "<lambda>")),
                             ({"initargs": (2,)}, ("(1,)", "(2,)"))]:
        with pytest.raises(pool.SharedPoolConflict) as raised:
            pool.shared(**asked)
        [(name, (has, wanted))] = raised.value.differing.items()
        assert name in asked and has == differing[0] and differing[1] in wanted
    assert lease.submit(tasks.read_init_value).result(60) == 1
    for each in [lease, *same]:
        each.shutdown()


def test_unknown_and_bad_options_raise_as_the_pool_would():
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_worker'"):
        pool.shared(max_worker=2)
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        pool.shared(max_workers=0)
    lease = pool.shared()  # nothing was left half made
    assert lease.submit(tasks.square, 2).result(60) == 4
    lease.shutdown()


def test_a_dropped_lease_is_released():
    lease = pool.shared(max_workers=1)
    old = lease._pool
    del lease
    gc.collect()
    replacing = pool.shared(max_workers=2)
    assert replacing._pool is not old
    replacing.shutdown()
    old._dispatcher.finished.result(30)


@pytest.mark.parametrize("method", START_METHODS)
def test_a_leases_shutdown_waits_for_its_own_tasks_only(method, tmp_path):
    ctx = multiprocessing.get_context(method)
    mine, theirs = pool.shared(max_workers=2, mp_context=ctx), pool.shared()
    gate_mine, gate_theirs = tmp_path / "mine", tmp_path / "theirs"
    my_task = mine.submit(tasks.wait_for_file, str(gate_mine), "mine")
    their_task = theirs.submit(tasks.wait_for_file, str(gate_theirs), "theirs")
    assert running(my_task, their_task)
    mine.shutdown(wait=False)  # released: refuses work, its task goes on
    with pytest.raises(RuntimeError, match="after shutdown"):
        mine.submit(tasks.square, 1)
    with pytest.raises(RuntimeError, match="after shutdown"):
        mine.map(tasks.square, [1])
    seen = []
    closing = threading.Thread(target=lambda: (mine.shutdown(wait=True),
                                               seen.append((my_task.done(), their_task.done()))))
    closing.start()
    gate_mine.touch()
    closing.join(60)
    assert seen == [(True, False)]  # returned once its own task was done, not the other's
    assert my_task.result() == "mine" and their_task.running()
    gate_theirs.touch()
    assert their_task.result(60) == "theirs"
    assert theirs.submit(tasks.square, 5).result(60) == 25  # the pool goes on
    theirs.shutdown()


def test_cancel_futures_cancels_only_the_leases_queued_tasks(tmp_path):
    mine, theirs = pool.shared(max_workers=1), pool.shared()
    gate = tmp_path / "gate"
    blocking = mine.submit(tasks.wait_for_file, str(gate), "blocking")
    assert running(blocking)
    my_queued = [mine.submit(tasks.identity, LARGE) for _ in range(2)]
    their_queued = [theirs.submit(tasks.identity, LARGE) for _ in range(2)]
    mine.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in my_queued)
    assert not any(f.done() for f in their_queued) and not blocking.done()
    gate.touch()
    assert blocking.result(60) == "blocking"
    assert [f.result(60) for f in their_queued] == [LARGE, LARGE]
    theirs.shutdown()


@pytest.mark.parametrize("method", START_METHODS)
def test_a_worker_death_through_a_lease_fails_that_task_only(method, tmp_path):
    mine = pool.shared(max_workers=2, mp_context=multiprocessing.get_context(method))
    theirs = pool.shared()
    gate = tmp_path / "gate"
    their_task = theirs.submit(tasks.wait_for_file, str(gate), "theirs")
    assert running(their_task)
    death = mine.submit(tasks.sigkill_self).exception(60)
    assert isinstance(death, pool.WorkerDied) and death.signal_name == "SIGKILL"
    assert mine.submit(tasks.square, 6).result(60) == 36
    gate.touch()
    assert their_task.result(60) == "theirs"
    with mine, theirs:
        pass


def test_timeouts_through_a_lease():
    with pool.shared(max_workers=1, task_timeout=0.5) as lease:
        assert isinstance(lease.submit(tasks.sleep_then, 30).exception(60), pool.TaskTimeout)
        stopped = lease.schedule(tasks.sleep_then, (30,), timeout=0.3).exception(60)
        assert isinstance(stopped, pool.TaskTimeout) and stopped.timeout == 0.3
        assert lease.schedule(tasks.sleep_then, (0.6, "no limit"), timeout=None).result(60) \
            == "no limit"


def test_stop_and_cancel_through_a_lease(tmp_path):
    with pool.shared(max_workers=1) as lease:
        stuck = lease.submit(tasks.wait_for_file, str(tmp_path / "never"))
        assert running(stuck)
        queued = lease.submit(tasks.identity, LARGE)
        assert queued.cancel() and queued.cancelled()
        assert stuck.stop()
        assert wait_until(stuck.cancelled, 30)
        assert lease.submit(tasks.square, 7).result(60) == 49


def test_map_through_a_lease():
    with pool.shared(max_workers=2) as lease:
        done = []
        assert list(lease.map(tasks.square, range(10), chunksize=3, progress=done.append)) \
            == [i * i for i in range(10)]
        assert sum(done) == 10
        lazily = lease.map(tasks.square, range(100), buffersize=2)
        assert next(lazily) == 0
        lease.shutdown(wait=False)
        with pytest.raises(RuntimeError, match="after shutdown"):
            list(lazily)  # the next lazy submission is refused, as after a pool's shutdown


def test_an_interrupt_leaving_with_stops_the_leases_tasks_only(tmp_path):
    theirs = pool.shared(max_workers=2)
    gate = tmp_path / "gate"
    their_task = theirs.submit(tasks.wait_for_file, str(gate), "theirs")
    with pytest.raises(KeyboardInterrupt):
        with pool.shared() as mine:
            my_task = mine.submit(tasks.wait_for_file, str(tmp_path / "never"))
            assert running(my_task, their_task)
            raise KeyboardInterrupt
    assert my_task.cancelled()  # stopped, and the with block waited for that
    with pytest.raises(RuntimeError, match="after shutdown"):
        mine.submit(tasks.square, 1)
    gate.touch()
    assert their_task.result(60) == "theirs"
    theirs.shutdown()


def test_async_with_waits_for_the_leases_tasks_and_a_cancel_stops_them(tmp_path):
    async def use() -> list[object]:
        async with pool.shared(max_workers=1) as lease:
            futures = [lease.submit(tasks.sleep_then, 0.05, i) for i in range(3)]
            first = await futures[0]
        return [first, *(f.result(0) for f in futures)]  # all done once the block is left
    assert asyncio.run(use()) == [0, 0, 1, 2]

    async def cancelled() -> None:
        lease = pool.shared()
        stuck = lease.submit(tasks.wait_for_file, str(tmp_path / "never"))
        leaving = asyncio.ensure_future(lease.__aexit__(None, None, None))
        await asyncio.sleep(0)
        while not stuck.running():
            await asyncio.sleep(0.01)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert stuck.cancelled()
    asyncio.run(cancelled())


def test_a_broken_shared_pool_is_replaced_even_while_leased():
    lease = pool.shared(max_workers=1)
    assert lease.submit(tasks.square, 2).result(60) == 4
    lease._pool._dispatcher._loop._injected_fault = RuntimeError("injected")
    lease._pool._dispatcher._wakeup.wake()
    lease._pool._dispatcher.finished.result(30)
    with pytest.raises(pool.PoolInternalError):
        lease.submit(tasks.square, 2)
    fresh = pool.shared()
    assert fresh._pool is not lease._pool
    assert fresh.submit(tasks.square, 3).result(60) == 9
    with lease, fresh:
        pass


MANY_THREADS = 16
# What each thread asks for: no options (any shared pool will do), the default options
# named, or one worker more (it differs).
ANY, NAMED, OTHER = {}, {"max_workers": DEFAULT_WORKERS}, {"max_workers": DEFAULT_WORKERS + 1}


def lease_submit_release(kinds, cycles, every=1):
    """Each thread (one per kind) runs ``cycles`` cycles of shared() / submit / shutdown,
    asking for its kind's options every ``every`` cycles and for none otherwise. Shutdowns
    alternate: wait=True (its task must be done when it returns), wait=False, and
    cancel_futures=True. Returns (futures by cycle, conflicts per thread, unexpected)."""
    start = threading.Barrier(len(kinds))
    unexpected: list[str] = []
    conflicts = [0] * len(kinds)
    futures: list[tuple[int, pool.PoolFuture[tuple[int, int]]]] = []

    def cycle_through(index: int) -> None:
        start.wait()
        for cycle in range(cycles):
            options = kinds[index] if cycle % every == 0 else ANY
            try:
                lease = pool.shared(**options)
            except pool.SharedPoolConflict as conflict:
                conflicts[index] += 1
                if list(conflict.differing) != ["max_workers"] or not options:
                    unexpected.append(f"{options}: {conflict!r}")
                continue
            except BaseException as exc:
                unexpected.append(f"{options}: shared(): {exc!r}")
                continue
            try:
                future = lease.submit(tasks.value_and_pid, cycle)
                futures.append((cycle, future))
                if cycle % 3 == 0:
                    lease.shutdown(wait=True)
                    if not future.done():
                        unexpected.append("shutdown(wait=True) returned before its task")
                else:
                    lease.shutdown(wait=False, cancel_futures=cycle % 3 == 2)
                try:
                    lease.submit(tasks.square, 1)
                    unexpected.append("a released lease took a task")
                except RuntimeError:
                    pass
            except BaseException as exc:
                unexpected.append(f"{options}: {exc!r}")

    threads = [threading.Thread(target=cycle_through, args=(i,)) for i in range(len(kinds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(100)
    assert not any(thread.is_alive() for thread in threads)
    return futures, conflicts, unexpected


def check_resolved(futures):
    """Every future resolves: cancelled, or the result of its own call. Returns the
    workers that ran them and how many were cancelled."""
    results = [(cycle, f.result(60)) for cycle, f in futures if not f.cancelled()]
    assert all(cycle == value for cycle, (value, _) in results)
    return {pid for _, (_, pid) in results}, len(futures) - len(results)


@pytest.mark.isolated
@pytest.mark.timeout(120)
def test_many_threads_lease_submit_and_release():
    began = time.monotonic()
    # 16 threads x 1,000 cycles while a lease on the default pool is out (a library that
    # holds one): the threads that ask for another worker count must get SharedPoolConflict
    # naming max_workers, every time; the others a lease, every time.
    holder = pool.shared()
    kinds = [ANY] * 7 + [NAMED] * 7 + [OTHER] * 2
    futures, conflicts, unexpected = lease_submit_release(kinds, 1000)
    assert unexpected == []
    assert conflicts == [0] * 14 + [1000, 1000]
    assert len(futures) == 14 * 1000
    workers, cancelled = check_resolved(futures)
    assert holder._pool._max_workers == DEFAULT_WORKERS
    holder.shutdown()
    held = time.monotonic() - began
    # Then with no lease held throughout: now and then a call for other options finds no
    # lease out and replaces the pool, under the other threads' feet. Still only leases
    # and conflicts, never from a call without options; every future resolves.
    more, more_conflicts, unexpected = lease_submit_release(kinds, 100, every=10)
    assert unexpected == []
    assert more_conflicts[:7] == [0] * 7
    assert len(more) + sum(more_conflicts) == 16 * 100
    more_workers, more_cancelled = check_resolved(more)
    pools = len({f._stopper for _, f in more})
    _shared.discard()
    workers |= more_workers
    print(f"SUMMARY held: {len(futures)} leases, {sum(conflicts)} conflicts, {cancelled} "
          f"cancelled, {held:.1f} s; not held: {len(more)} leases, {sum(more_conflicts)} "
          f"conflicts, {more_cancelled} cancelled, {pools} pools; {len(workers)} workers, "
          f"{time.monotonic() - began:.1f} s")
    assert wait_until(lambda: not any(process_exists(pid) for pid in workers), 30)


FORKED_CHILD = '''
from pool import _shared
lease = pool.shared(max_workers=1, mp_context=CTX)
parent_worker = lease.submit(tasks.pid_of_worker).result(60)
reading, writing = os.pipe()
child = os.fork()
if child == 0:
    try:
        try:
            lease.submit(tasks.square, 2)
            inherited = "accepted"
        except RuntimeError as exc:
            inherited = str(exc)
        lease.shutdown()  # a copy of the parent's: returns at once, touches nothing
        with pool.shared() as own:
            facts = dict(inherited=inherited, same_pool=own._pool is lease._pool,
                         child_worker=own.submit(tasks.pid_of_worker).result(60))
        _shared.discard()
        facts["left"] = sorted(helpers.children_of(os.getpid()) - helpers.helper_pids())
        os.write(writing, json.dumps(facts).encode())
    finally:
        os._exit(0)
os.close(writing)
with os.fdopen(reading) as pipe:
    facts = json.loads(pipe.read())
os.waitpid(child, 0)
after = lease.submit(tasks.pid_of_worker).result(60)
lease.shutdown()
_shared.discard()
report(parent_worker=parent_worker, after=after, **facts)
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_a_forked_child_makes_a_shared_pool_of_its_own(method, tmp_path):
    facts, _ = run_script(FORKED_CHILD, method, tmp_path, timeout=90)
    assert "a forked child" in facts["inherited"] and "call pool.shared() there" in facts["inherited"]
    assert facts["same_pool"] is False
    assert facts["child_worker"] != facts["parent_worker"]
    assert facts["after"] == facts["parent_worker"]  # the parent's pool went on as it was
    assert facts["left"] == [] and facts["children_left"] == [] and facts["threads_left"] == []


EXIT_IN_USE = '''
busy = pool.shared(max_workers=2, mp_context=CTX)
busy.submit(tasks.sleep_then_touch, 0.3, os.path.abspath("late"))
released = pool.shared()
released.submit(tasks.square, 2).result(60)
released.shutdown()
workers = sorted(busy._pool._processes)
print("WORKERS", json.dumps(workers), flush=True)
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_interpreter_exit_with_the_shared_pool_in_use_leaves_no_process(method, tmp_path):
    _, proc = run_script(EXIT_IN_USE, method, tmp_path, timeout=60)
    workers = json.loads(proc.stdout.split("WORKERS")[1].splitlines()[0])
    assert workers and (tmp_path / "late").exists()  # the exit let the leased task finish
    assert wait_until(lambda: not any(process_exists(pid) for pid in workers), 30)
    assert proc.stderr == ""

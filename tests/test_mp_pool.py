"""``pool.Pool``, the ``multiprocessing.Pool`` face: the stdlib's API and refusals, pinned
side by side with ``multiprocessing.Pool`` itself, and what it does better: a worker's
death fails what it was running and the pool goes on, an item's exception fails that
item alone, and no result is left waiting for ever.

Deaths run in child interpreters under a hard timeout (``run_script``); the rest run here,
each pool ended by the test, under the leak check of every test.
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing
import multiprocessing.pool
import os
import pickle
import threading
from concurrent.futures import CancelledError
from typing import Any, Callable

import pytest

import pool
import tasks
from helpers import START_METHODS, run_script, wait_until

square_or_fail = functools.partial(tasks.square_unless, fail=(7,))


@pytest.fixture(params=START_METHODS)
def ctx(request: pytest.FixtureRequest) -> Any:
    return multiprocessing.get_context(request.param)


def both(ctx: Any, use: Callable[[Any], Any]) -> tuple[Any, Any]:
    """What ``use(pool)`` gives with the stdlib's Pool and with pool.Pool, each pool
    closed and joined after."""
    answers = []
    for make in (multiprocessing.pool.Pool, pool.Pool):
        p = make(2, context=ctx)
        try:
            answers.append(use(p))
        finally:
            p.close()
            p.join()
            del p
            gc.collect()  # the stdlib's pool closes its pipes once collected
    return answers[0], answers[1]


def outcomes(iterator: Any) -> list[Any]:
    """Every item of an imap, a failure as ``(type name, message)``, going on after it."""
    got: list[Any] = []
    while True:
        try:
            got.append(next(iterator))
        except StopIteration:
            return got
        except Exception as error:
            got.append((type(error).__name__, str(error)))


# -- the same as the stdlib's ----------------------------------------------------------------

def test_the_calls_answer_as_the_stdlibs_do(ctx):
    def use(p):
        return [p.apply(tasks.add, (1, 2), {"c": 3}),
                p.apply_async(tasks.add, (2,), {"b": 5}).get(30),
                p.map(tasks.square, range(10)),
                p.map(tasks.square, iter(range(10)), chunksize=3),
                p.map(tasks.square, []),
                p.starmap(tasks.add, [(1, 2), (3, 4)]),
                p.map_async(tasks.square, range(5)).get(30),
                p.starmap_async(tasks.add, [(5, 6)], chunksize=1).get(30),
                list(p.imap(tasks.square, range(7))),
                list(p.imap(tasks.square, (x for x in range(7)), chunksize=3)),
                sorted(p.imap_unordered(tasks.square, range(7), chunksize=2)),
                list(p.imap(tasks.square, []))]
    stdlib, ours = both(ctx, use)
    assert ours == stdlib


def test_a_tasks_exception_reaches_the_caller_as_the_stdlibs_does(ctx):
    def use(p):
        raised = []
        for call in (lambda: p.apply(square_or_fail, (7,)),
                     lambda: p.map(square_or_fail, range(10)),
                     lambda: p.map_async(square_or_fail, range(10), chunksize=4).get(30)):
            with pytest.raises(ValueError) as caught:
                call()
            raised.append(str(caught.value))
        result = p.apply_async(square_or_fail, (7,))
        result.wait(30)
        return raised, result.ready(), result.successful()
    stdlib, ours = both(ctx, use)
    assert ours == stdlib == (["7 fails"] * 3, True, False)


def test_callbacks_run_in_this_process_before_the_result_is_ready(ctx):
    def use(p):
        seen = []
        done = p.apply_async(tasks.square, (3,), callback=seen.append)
        failed = p.apply_async(square_or_fail, (7,), error_callback=lambda e: seen.append(str(e)))
        mapped = p.map_async(tasks.square, range(4), callback=seen.append)
        for result in (done, failed, mapped):
            result.wait(30)
        return sorted(map(str, seen)), os.getpid()
    stdlib, ours = both(ctx, use)
    assert ours == stdlib and ours[0] == ["7 fails", "9", "[0, 1, 4, 9]"]


def test_timeouts_raise_multiprocessing_timeout_error(ctx, tmp_path):
    gate = str(tmp_path / "gate")

    def use(p):
        raised = []
        slow = p.apply_async(tasks.wait_for_file, (gate, 1))
        with pytest.raises(multiprocessing.TimeoutError):
            slow.get(0.05)
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        raised.append(slow.ready())
        iterator = p.imap(tasks.wait_for_file, [gate])
        with pytest.raises(multiprocessing.TimeoutError):
            iterator.next(timeout=0.05)
        tasks.touch(gate)
        raised += [slow.get(30), iterator.next(30)]
        os.unlink(gate)
        return raised
    stdlib, ours = both(ctx, use)
    assert ours == stdlib == [False, 1, None]


def test_what_the_stdlib_refuses_pool_refuses_the_same_way(ctx):
    def refusals(make):
        said = []
        for bad in (lambda: make(0, context=ctx),
                    lambda: make(1, maxtasksperchild=0, context=ctx),
                    lambda: make(1, initializer=42, context=ctx)):
            with pytest.raises((ValueError, TypeError)) as caught:
                bad()
            said.append((caught.type.__name__, str(caught.value)))
        p = make(1, context=ctx)
        try:
            with pytest.raises(ValueError) as caught:
                p.join()
            said.append(str(caught.value))
            with pytest.raises(ValueError) as caught:
                p.imap(tasks.square, [1], chunksize=0)
            said.append(str(caught.value))
            with pytest.raises(NotImplementedError) as caught:
                pickle.dumps(p)
            said.append(str(caught.value))
            p.close()
            for call in (lambda: p.apply(tasks.square, (1,)), lambda: p.map(tasks.square, [1]),
                         lambda: p.imap_unordered(tasks.square, [1]),
                         lambda: p.__enter__()):
                with pytest.raises(ValueError) as caught:
                    call()
                said.append(str(caught.value))
        finally:
            p.terminate()
            p.join()
        return said
    ours, stdlib = refusals(pool.Pool), refusals(multiprocessing.pool.Pool)
    gc.collect()  # the stdlib's pools, whole or half made, close their pipes once collected
    assert ours == stdlib


def test_a_running_pool_dropped_warns_as_the_stdlibs_does(ctx):
    p = pool.Pool(1, context=ctx)
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        p.__del__()
    p.terminate()
    p.join()


def test_repr_and_the_attributes_code_reads(ctx):
    with pool.Pool(2, context=ctx) as p:
        assert repr(p) == "<pool.Pool state=RUN pool_size=2>"
        assert p._processes == 2 and p._ctx is ctx
        p.map(tasks.square, range(4))
        pids = {process.pid for process in p._pool}
        assert pids and pids <= set(p.map(tasks.pid_of_worker, range(8))) | pids
    assert "TERMINATE" in repr(p)


# -- better than the stdlib's ----------------------------------------------------------------

def test_an_items_exception_fails_that_item_alone_even_in_a_chunk(ctx):
    with pool.Pool(2, context=ctx) as p:
        got = outcomes(p.imap(square_or_fail, range(10), chunksize=4))
        assert got == [0, 1, 4, 9, 16, 25, 36, ("ValueError", "7 fails"), 64, 81]
        unordered = outcomes(p.imap_unordered(square_or_fail, range(10), chunksize=4))
        assert sorted(map(str, unordered)) == sorted(map(str, got))


def test_a_callback_that_raises_is_logged_and_the_result_is_ready(ctx, caplog):
    def bad_callback(value):
        raise RuntimeError("callback broke")

    with pool.Pool(1, context=ctx) as p, caplog.at_level(logging.ERROR, logger="pool"):
        result = p.apply_async(tasks.square, (4,), callback=bad_callback)
        assert result.get(30) == 16
        assert p.apply(tasks.square, (5,)) == 25  # and the pool goes on
    assert "callback broke" in caplog.text


def test_terminate_fails_what_it_leaves_unfinished_instead_of_leaving_it_waiting(ctx, tmp_path):
    gate = str(tmp_path / "gate")
    p = pool.Pool(1, context=ctx)
    running = p.apply_async(tasks.wait_for_file, (gate,))
    queued = p.map_async(tasks.square, range(4))
    items = p.imap(tasks.square, range(3))
    assert wait_until(lambda: p._executor.stats().running == 1, 30)
    p.terminate()
    p.join()
    with pytest.raises(pool.WorkerTerminated):
        running.get(30)
    with pytest.raises(CancelledError):
        queued.get(30)
    assert [name for name, _ in outcomes(items)] == ["CancelledError"] * 3


def test_close_runs_the_input_an_imap_is_still_reading(ctx):
    released = threading.Event()

    def slow_input():
        yield 1
        released.wait(30)
        yield from range(2, 6)

    p = pool.Pool(2, context=ctx)
    results = p.imap(tasks.square, slow_input())
    assert next(results) == 1
    p.close()
    released.set()
    assert list(results) == [4, 9, 16, 25]
    p.join()


def test_an_input_that_raises_fails_the_item_it_was_reading_then_ends(ctx):
    def broken_input():
        yield from range(3)
        raise OSError("input broke")

    with pool.Pool(2, context=ctx) as p:
        got = outcomes(p.imap(tasks.square, broken_input()))
    assert got == [0, 1, 4, ("OSError", "input broke")]


def test_a_result_the_worker_cannot_pickle_is_the_stdlibs_maybe_encoding_error(ctx):
    def use(p):
        seen = []
        result = p.apply_async(tasks.return_lock, error_callback=seen.append)
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as caught:
            result.get(30)
        chunk = p.map_async(tasks.return_lock, range(3), chunksize=3)
        with pytest.raises(multiprocessing.pool.MaybeEncodingError):
            chunk.get(30)
        return (type(seen[0]).__name__, "cannot pickle" in str(caught.value),
                p.apply(tasks.square, (3,)))  # and the pool goes on
    stdlib, ours = both(ctx, use)
    assert ours == stdlib == ("MaybeEncodingError", True, 9)


def test_an_unpicklable_argument_fails_its_result(ctx):
    with pool.Pool(1, context=ctx) as p:
        result = p.apply_async(tasks.identity, (threading.Lock(),))
        with pytest.raises(pool.ArgumentPicklingError):
            result.get(30)
        assert p.apply(tasks.identity, (3,)) == 3


def test_next_with_no_time_left_hands_out_what_has_arrived(ctx):
    with pool.Pool(2, context=ctx) as p:
        for iterator in (p.imap(tasks.square, range(5)), p.imap_unordered(tasks.square, range(5))):
            assert wait_until(lambda: p._executor.stats().queued + p._executor.stats().running
                              == 0, 30)
            got = [iterator.next(timeout=0) for _ in range(5)]
            assert sorted(got) == [0, 1, 4, 9, 16]
            with pytest.raises(StopIteration):
                iterator.next(timeout=0)


def test_an_endless_input_is_read_as_the_work_goes(ctx, tmp_path):
    # With every task held, the feeder reads exactly its window of chunks and waits for one
    # to end (the stdlib's task thread is held back by its pipe the same way).
    counter, gate = tmp_path / "read", str(tmp_path / "gate")
    with pool.Pool(2, context=ctx) as p:
        window = p._window()
        iterator = p.imap(functools.partial(tasks.gated_square, gate),
                          tasks.counted_input(str(counter)), chunksize=3)
        assert wait_until(lambda: counter.exists() and int(counter.read_text()) >= 3 * window, 60)
        assert int(counter.read_text()) == 3 * window
        tasks.touch(gate)
        assert [next(iterator) for _ in range(10)] == [n * n for n in range(10)]


def test_callbacks_never_run_on_the_callers_thread(ctx):
    # A call that cannot be pickled fails at once: its error_callback still runs on a
    # thread of the pool's, so a caller holding a lock the callback takes does not
    # deadlock (the stdlib runs it on its task thread).
    lock = threading.Lock()
    seen = []

    def error_callback(error):
        with lock:
            seen.append((type(error).__name__, threading.get_ident()))

    with pool.Pool(1, context=ctx) as p:
        with lock:
            result = p.apply_async(tasks.identity, (threading.Lock(),),
                                   error_callback=error_callback)
            mapped = p.map_async(tasks.identity, [threading.Lock()], error_callback=error_callback)
        result.wait(30)
        mapped.wait(30)
        assert result.ready() and mapped.ready()
    assert sorted(name for name, _ in seen) == ["ArgumentPicklingError"] * 2
    assert threading.get_ident() not in {ident for _, ident in seen}


def test_a_callback_may_wait_for_a_result_it_asked_for(ctx):
    # (A review found it: work a callback thread queued ran only after that callback
    # returned, so a callback waiting for a result it had just asked for waited on itself.)
    inner = []

    def callback(_):
        result = p.apply_async(tasks.identity, (threading.Lock(),),
                               error_callback=lambda error: None)
        result.wait(10)
        inner.append(result.ready())

    with pool.Pool(1, context=ctx) as p:
        p.apply_async(tasks.square, (2,), callback=callback).wait(30)
    assert inner == [True]


def test_a_second_consumer_of_one_iterator_is_given_its_timeout(ctx, tmp_path):
    gate = str(tmp_path / "gate")
    with pool.Pool(1, context=ctx) as p:
        iterator = p.imap(tasks.wait_for_file, [gate, gate])
        first = threading.Thread(target=lambda: iterator.next(60))
        first.start()
        try:
            with pytest.raises(multiprocessing.TimeoutError):
                iterator.next(timeout=0.2)  # while the first one waits inside next()
        finally:
            tasks.touch(gate)
            first.join(60)
        assert iterator.next(30) is None


def test_an_input_that_raises_a_base_exception_ends_the_iteration_there(ctx):
    def input_that_exits():
        yield 1
        raise SystemExit("the input gave up")

    with pool.Pool(1, context=ctx) as p:
        iterator = p.imap(tasks.square, input_that_exits())
        assert next(iterator) == 1
        with pytest.raises(SystemExit, match="the input gave up"):
            next(iterator)
        with pytest.raises(StopIteration):
            next(iterator)


def test_isinstance_holds_for_every_stdlib_pool_while_patched(ctx):
    with pool.patch():
        with multiprocessing.pool.ThreadPool(1) as threads:
            assert isinstance(threads, multiprocessing.pool.Pool)
        threads.join()
        p = multiprocessing.pool.Pool(1, context=ctx)
        try:
            assert isinstance(p, multiprocessing.pool.Pool) and isinstance(p, pool.Pool)
        finally:
            p.terminate()
            p.join()


DEATHS = '''
import functools, tempfile
from concurrent.futures import process
die_at_13 = functools.partial(tasks.square_unless, fail=(), die=(13,))
seen = []
with pool.Pool(2, context=CTX) as p:
    failed = p.apply_async(tasks.sigkill_self, error_callback=seen.append)
    try:
        failed.get(60)
    except pool.WorkerDied as error:
        died = [str(error).splitlines()[0], isinstance(error, process.BrokenProcessPool)]
    after = p.apply(tasks.square, (3,))
    marks = tempfile.mkdtemp()
    try:
        p.map(functools.partial(tasks.mark_then, marks, die=(13,)), range(40), chunksize=1)
    except pool.WorkerDied:
        map_raised = True
    ran = sorted(int(name) for name in os.listdir(marks))
    items = []
    iterator = p.imap(die_at_13, range(20))
    while True:
        try:
            items.append(next(iterator))
        except StopIteration:
            break
        except pool.WorkerDied:
            items.append("died")
    workers = [process.pid for process in p._pool]
report(died=died, callback=[type(e).__name__ for e in seen], after=after,
       map_raised=map_raised, ran=ran, items=items, workers=workers,
       alive=[pid for pid in workers if helpers.process_exists(pid)])
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_a_death_fails_what_the_worker_was_running_and_the_pool_goes_on(method, tmp_path):
    facts, _ = run_script(DEATHS, method, tmp_path, timeout=120)
    assert facts["died"][0].startswith("worker pid ") and "SIGKILL" in facts["died"][0]
    assert facts["died"][1] and facts["callback"] == ["WorkerDied"] and facts["after"] == 9
    # map raises once the rest ran: every other item ran, the one that killed its worker once
    assert facts["map_raised"] and facts["ran"] == list(range(40))
    assert facts["items"] == [x * x if x != 13 else "died" for x in range(20)]
    assert facts["workers"] and facts["alive"] == []
    assert facts["children_left"] == [] and facts["threads_left"] == []


HANGS_IN_PLAIN_PYTHON = '''
import multiprocessing.pool
with multiprocessing.pool.Pool(2, context=CTX) as p:
    result = p.apply_async(tasks.sigkill_self)
    try:
        result.get(5)
        print("GOT")
    except multiprocessing.TimeoutError:
        print("NEVER READY")
report()
'''


@pytest.mark.parametrize("method", ["forkserver"])
def test_the_premise_the_stdlibs_result_never_comes(method, tmp_path):
    # Why pool.Pool exists: the stdlib's result of a task whose worker died never comes.
    _, proc = run_script(HANGS_IN_PLAIN_PYTHON, method, tmp_path, timeout=60)
    assert "NEVER READY" in proc.stdout


def test_gc_does_not_end_a_pool_with_work_in_flight(ctx):
    p = pool.Pool(1, context=ctx)
    result = p.map_async(tasks.square, range(3))
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        del p
        gc.collect()
    assert result.get(30) == [0, 1, 4]

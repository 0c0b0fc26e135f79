"""The stdlib semantics a drop-in replacement for ProcessPoolExecutor must keep."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import itertools
import os
import re
import sys
import threading
import traceback
import weakref

import pytest

import pool
import tasks
from helpers import process_exists, wait_until


def test_is_an_executor_and_the_alias_is_the_same_class():
    assert pool.ProcessPoolExecutor is pool.ProcessPool
    assert issubclass(pool.ProcessPool, cf.Executor)


def test_submit_returns_a_stdlib_future_with_the_result(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        future = p.submit(tasks.add, 1, 2, c=4)
        assert isinstance(future, cf.Future)
        assert future.result(timeout=30) == 7


def test_map_keeps_input_order_over_several_iterables(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.add, range(20), range(0, 40, 2))) == [3 * i for i in range(20)]


@pytest.mark.parametrize("chunksize", [1, 3, 50])
def test_map_chunks_give_the_same_results(ctx, chunksize):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.square, range(23), chunksize=chunksize)) == [
            i * i for i in range(23)]
        assert list(p.map(tasks.add, range(23), range(23, 0, -1), chunksize=chunksize)) == [
            23] * 23
        items = [(1, 2), (), "ab", None] * 3  # items that are tuples stay whole
        assert list(p.map(tasks.identity, items, chunksize=chunksize)) == items


class CountingPool(pool.ProcessPool):
    """A subclass that overrides submit, as code built on the stdlib's executor does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.submitted = []

    def submit(self, fn, /, *args, **kwargs):
        self.submitted.append(args)
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("chunksize", [1, 4])
def test_map_goes_through_an_overriding_submit(ctx, chunksize):
    with CountingPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.square, range(10), chunksize=chunksize)) == [
            i * i for i in range(10)]
        assert len(p.submitted) == (10 if chunksize == 1 else 3)  # a task per chunk


def test_map_goes_through_a_submit_wrapped_on_the_instance(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        done = []
        original = p.submit

        def counting_submit(*args, **kwargs):
            future = original(*args, **kwargs)
            future.add_done_callback(done.append)
            return future
        p.submit = counting_submit
        assert list(p.map(tasks.add, range(9), range(9))) == [2 * i for i in range(9)]
        # Every task's callbacks have run by the time map hands its result on.
        assert len(done) == 9
        del p.submit  # the pool's own again: the grouped fast path
        assert list(p.map(tasks.square, range(3))) == [0, 1, 4] and len(done) == 9


def test_tqdm_process_map_counts_every_task(monkeypatch):
    pytest.importorskip("tqdm")
    import io
    import multiprocessing

    import tqdm
    from tqdm.contrib.concurrent import _executor_map  # process_map, with the executor given
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # (no monitor thread left behind)
    bar = io.StringIO()
    # (fork: tqdm shares a lock made in the default context, which is fork before 3.14)
    results = _executor_map(pool.ProcessPool, tasks.square, range(9), max_workers=2,
                            tqdm_class=tqdm.tqdm, file=bar,
                            mp_context=multiprocessing.get_context("fork"))
    assert results == [i * i for i in range(9)]
    assert "9/9" in bar.getvalue().splitlines()[-1].split("\r")[-1]


def test_map_raises_at_the_failing_item(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        results = p.map(tasks.square, [1, 2, "x", 4])
        assert next(results) == 1
        assert next(results) == 4
        with pytest.raises(TypeError):
            next(results)



def test_an_eager_map_submits_each_item_of_an_unsized_input_as_it_reads_it(ctx, tmp_path):
    # map() without buffersize reads its whole input before it returns. An iterator may
    # block between items, even until an earlier task has had its effect (as here): each
    # item must be submitted when it is read, as the stdlib does, not kept for a group.
    # (Sized inputs, which cannot block, go in groups: the next test.)
    def items():
        for i in range(6):
            path = tmp_path / str(i)
            yield str(path)
            for _ in range(300):  # a bounded poll for the task's effect, not a sleep
                if path.exists():
                    break
                threading.Event().wait(0.05)
            assert path.exists(), f"item {i} was read but its task had not run"

    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.touch, items())) == [str(tmp_path / str(i)) for i in range(6)]


def test_an_item_that_cannot_be_pickled_fails_only_its_own_place_in_a_map(ctx):
    # The input goes in groups of 1, 2, 4 ... 64 items: the lock is in the seventh group,
    # behind six items of its own group, which still run.
    items = [*range(69), threading.Lock(), 70]
    with pool.ProcessPool(2, mp_context=ctx) as p:
        results = p.map(tasks.identity, items)
        assert [next(results) for _ in range(69)] == list(range(69))
        with pytest.raises(pool.ArgumentPicklingError, match="argument 0"):
            next(results)


def test_map_timeout_raises_timeout_error(ctx, tmp_path):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        gate = tmp_path / "gate"
        results = p.map(tasks.wait_for_file, [str(gate)], timeout=0.2)
        with pytest.raises(TimeoutError):
            next(results)
        gate.touch()


def test_map_with_buffersize_reads_its_input_lazily(ctx):
    consumed = []

    def numbers():
        for i in itertools.count():
            consumed.append(i)
            yield i

    with pool.ProcessPool(2, mp_context=ctx) as p:
        results = p.map(tasks.square, numbers(), buffersize=3)
        assert [next(results) for _ in range(5)] == [0, 1, 4, 9, 16]
        assert len(consumed) <= 5 + 3
        results.close()


@pytest.mark.parametrize("kwargs, error", [
    ({"chunksize": 0}, ValueError), ({"buffersize": 0}, ValueError),
    ({"buffersize": 1.5}, TypeError)])
def test_map_rejects_bad_arguments(kwargs, error):
    with pool.ProcessPool(1) as p:
        with pytest.raises(error):
            p.map(tasks.square, [1], **kwargs)


def test_exceptions_keep_type_message_and_worker_frames(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        with pytest.raises(ValueError, match="^custom$") as info:
            p.submit(tasks.raise_value_error, "custom").result(timeout=30)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "raise_value_error" in frames  # the worker's own frame, not a text blob


@pytest.mark.parametrize("make_error", ["raise", "result fails to unpickle"])
def test_a_remote_exception_keeps_nothing_of_the_pool_alive(ctx, make_error):
    # tblib rebuilds remote frames from real ones, and a reducer failing in the parent leaves
    # real frames: their f_back chains lead into the dispatcher, whose frames held reply
    # bodies and worker handles. Kept by the caller's exception, those must hold nothing.
    with pool.ProcessPool(1, mp_context=ctx) as p:
        if make_error == "raise":
            error = p.submit(tasks.raise_value_error, "x").exception(timeout=30)
        else:
            error = p.submit(tasks.return_unpickle_bomb_for_parent, "raise").exception(timeout=30)
            assert isinstance(error, pool.ResultTransferError)
    held = set()
    for exc in (error, error.__cause__):
        tb = exc.__traceback__ if exc is not None else None
        while tb is not None:
            frame = tb.tb_frame
            while frame is not None:
                if f"{os.sep}_dispatcher{os.sep}" in frame.f_code.co_filename:
                    held |= set(frame.f_locals) - {"self"}
                frame = frame.f_back
            tb = tb.tb_next
    assert not held & {"worker", "frame", "submission", "outcome", "slot"}, held


def test_exception_chains_are_kept(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        error = p.submit(tasks.raise_chained).exception(timeout=30)
    assert type(error) is RuntimeError
    assert type(error.__context__) is FileNotFoundError and error.__context__.errno == 2
    assert type(error.__context__.__cause__) is KeyError
    assert "raise_chained" in "".join(traceback.format_exception(error))


def test_cancel_works_on_queued_not_on_running(ctx, tmp_path):
    gate = tmp_path / "gate"
    with pool.ProcessPool(1, mp_context=ctx) as p:
        running = p.submit(tasks.wait_for_file, str(gate), "done")
        queued = p.submit(tasks.square, 3)
        while not running.running():
            running.exception(timeout=0.01) if running.done() else threading.Event().wait(0.01)
        assert queued.cancel()
        assert not running.cancel()
        gate.touch()
        assert running.result(timeout=30) == "done"
        assert queued.cancelled()


def test_shutdown_cancel_futures_cancels_what_has_not_started(ctx, tmp_path):
    gate = tmp_path / "gate"
    p = pool.ProcessPool(1, mp_context=ctx)
    running = p.submit(tasks.wait_for_file, str(gate), "done")
    queued = [p.submit(tasks.square, i) for i in range(5)]
    while not running.running():
        threading.Event().wait(0.01)
    p.shutdown(wait=False, cancel_futures=True)
    gate.touch()
    p.shutdown(wait=True)
    assert running.result() == "done"
    assert all(f.cancelled() for f in queued)


def test_submit_after_shutdown_raises_runtime_error(ctx):
    p = pool.ProcessPool(1, mp_context=ctx)
    p.submit(tasks.square, 2).result(timeout=30)
    p.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        p.submit(tasks.square, 2)
    with pytest.raises(RuntimeError, match="after shutdown"):
        p.map(tasks.square, [1])


def test_shutdown_without_wait_still_finishes_submitted_work(ctx):
    p = pool.ProcessPool(2, mp_context=ctx)
    futures = [p.submit(tasks.square, i) for i in range(10)]
    p.shutdown(wait=False)
    assert [f.result(timeout=30) for f in futures] == [i * i for i in range(10)]
    p.shutdown(wait=True)


def test_wait_and_as_completed(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        futures = [p.submit(tasks.square, i) for i in range(8)]
        done, not_done = cf.wait(futures, timeout=30)
        assert not not_done
        assert sorted(f.result() for f in cf.as_completed(futures, timeout=30)) == [
            i * i for i in range(8)]
        first = cf.wait([p.submit(tasks.raise_value_error)], return_when=cf.FIRST_EXCEPTION)
        assert len(first.done) == 1


def test_asyncio_wrap_future(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        async def main():
            return await asyncio.wrap_future(p.submit(tasks.square, 7))
        assert asyncio.run(main()) == 49


def test_run_in_executor(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        async def main():
            return await asyncio.get_running_loop().run_in_executor(p, tasks.square, 5)
        assert asyncio.run(main()) == 25


def test_context_manager_leaves_no_workers(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        pids = set(p.map(tasks.pid_of_worker, range(10)))
        assert all(process_exists(pid) for pid in pids)
    assert not any(process_exists(pid) for pid in pids)  # reaped by the time shutdown returns


@pytest.mark.parametrize("kwargs, error", [
    ({"max_workers": 0}, ValueError), ({"max_workers": -1}, ValueError),
    ({"initializer": 5}, TypeError), ({"max_tasks_per_child": 0}, ValueError),
    ({"max_tasks_per_child": "3"}, TypeError)])
def test_constructor_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        pool.ProcessPool(**kwargs)


def test_default_start_method_is_forkserver_on_linux():
    assert pool.ProcessPool()._mp_context.get_start_method() == "forkserver"


def test_max_tasks_per_child_replaces_workers_on_every_start_method(ctx):
    with pool.ProcessPool(1, mp_context=ctx, max_tasks_per_child=2) as p:
        pids = [p.submit(tasks.pid_of_worker).result(timeout=30) for _ in range(6)]
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]
    assert len(set(pids)) == 3


def test_initializer_runs_in_every_worker(ctx):
    with pool.ProcessPool(2, mp_context=ctx, initializer=tasks.init_sets,
                          initargs=("ready",)) as p:
        assert set(p.map(tasks.read_init_value, range(6))) == {"ready"}


def test_lambdas_and_closures_work(ctx):
    offset = 10
    with pool.ProcessPool(1, mp_context=ctx) as p:
        assert p.submit(lambda x: x + offset, 5).result(timeout=30) == 15
        assert list(p.map(lambda x: x * offset, range(3), chunksize=2)) == [0, 10, 20]
        assert p.submit(tasks.return_lambda).result(timeout=30)() == 42


def test_unpicklable_argument_fails_its_future_not_submit():
    with pool.ProcessPool(1) as p:
        futures = [p.submit(tasks.square, 2), p.submit(tasks.add, 1, threading.Lock()),
                   p.submit(tasks.add, 1, c=threading.Lock()), p.submit(threading.Lock().acquire),
                   p.submit(tasks.square, 3)]
        assert [f.result(timeout=30) for f in (futures[0], futures[4])] == [4, 9]
        for future, text in zip(futures[1:4], ["argument 1 .*lock", "keyword argument 'c'",
                                               "the function"]):
            error = future.exception(timeout=0)
            assert isinstance(error, pool.ArgumentPicklingError), error
            assert isinstance(error, __import__("pickle").PicklingError)
            assert isinstance(error, TypeError)  # what the stdlib's future raises for a lock
            assert type(error).__name__ == "ArgumentPicklingError"
            copy = __import__("pickle").loads(__import__("pickle").dumps(error))
            assert type(copy) is pool.ArgumentPicklingError and str(copy) == str(error)
            assert re.search(text, str(error)) and error.__cause__ is not None
        results = p.map(tasks.identity, [1, threading.Lock(), 3])
        assert next(results) == 1
        with pytest.raises(pool.ArgumentPicklingError):
            next(results)
        assert p.submit(tasks.square, 3).result(timeout=30) == 9  # and the pool is fine


def test_an_open_file_is_refused_as_the_stdlib_refuses_it_not_sent_as_a_copy(ctx, tmp_path):
    # cloudpickle, pool's by-value pickler, would send a StringIO of what is left to read.
    path = tmp_path / "text"
    path.write_text("hello")
    refused = "cannot pickle '_io.TextIOWrapper' object"
    with pool.ProcessPool(1, mp_context=ctx) as p, open(path) as f:
        as_argument = p.submit(tasks.identity, f).exception(timeout=30)
        assert isinstance(as_argument, TypeError) and refused in str(as_argument), as_argument
        in_closure = p.submit(lambda: f.read()).exception(timeout=30)
        assert isinstance(in_closure, TypeError) and refused in str(in_closure), in_closure
        returned = p.submit(tasks.open_file, str(path)).exception(timeout=30)
        assert isinstance(returned, TypeError) and refused in str(returned), returned
        # The standard streams still go, as the worker's own (cloudpickle's way). (The
        # process's own: pytest's capture stands in for sys.stdout and sys.stderr here.)
        stderr, stdout = sys.__stderr__, sys.__stdout__
        assert p.submit(lambda: print("", end="", file=stderr) or 1).result(30) == 1
        assert p.submit(print, "", end="", file=stdout).result(30) is None
        assert p.submit(tasks.square, 3).result(timeout=30) == 9


def test_a_socket_is_refused_naming_the_argument(ctx):
    # A documented difference: the stdlib duplicates a socket into the worker through
    # multiprocessing's resource sharer; pool refuses it at the call (README's differences).
    import socket
    with pool.ProcessPool(1, mp_context=ctx) as p, socket.socket() as sock:
        error = p.submit(tasks.identity, sock).exception(timeout=30)
        assert isinstance(error, pool.ArgumentPicklingError) and isinstance(error, TypeError)
        assert "argument 0" in str(error) and "cannot pickle 'socket' object" in str(error)


def test_submitting_what_is_not_callable_raises_at_the_call():
    # A documented difference: the stdlib returns a future that fails with TypeError.
    with pool.ProcessPool(1) as p:
        with pytest.raises(TypeError, match="42 is not callable"):
            p.submit(42)
        assert p.submit(tasks.square, 3).result(timeout=30) == 9


def test_a_reducer_raising_systemexit_fails_the_future_and_keyboardinterrupt_propagates():
    class Raises:
        def __init__(self, error):
            self.error = error

        def __reduce__(self):
            raise self.error

    with pool.ProcessPool(1) as p:
        error = p.submit(tasks.identity, Raises(SystemExit(3))).exception(timeout=0)
        assert type(error) is pool.ArgumentPicklingError  # (not also a SystemExit)
        with pytest.raises(KeyboardInterrupt):
            p.submit(tasks.identity, Raises(KeyboardInterrupt()))
        assert p.submit(tasks.square, 3).result(timeout=30) == 9


@pytest.mark.parametrize("chunksize", [1, 3])
def test_no_task_keeps_its_arguments_or_result_alive(ctx, chunksize):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        argument = tasks.Weakrefable()
        ref = weakref.ref(argument)
        assert type(p.submit(tasks.identity, argument).result(timeout=30)) is tasks.Weakrefable
        del argument
        gc.collect()
        assert ref() is None  # the resolved future holds neither argument nor result
        for result in p.map(tasks.make_weakrefable, range(7), chunksize=chunksize):
            ref = weakref.ref(result)
            del result
            gc.collect()
            assert ref() is None  # map holds no result once it has yielded it


def test_future_can_be_awaited_from_many_threads(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        future = p.submit(tasks.sleep_then, 0.1, "x")
        results = []
        threads = [threading.Thread(target=lambda: results.append(future.result(30)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == ["x"] * 4


def test_submit_from_many_threads(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        with cf.ThreadPoolExecutor(8) as threads:
            futures = list(threads.map(lambda i: p.submit(tasks.square, i), range(200)))
        assert [f.result(timeout=60) for f in futures] == [i * i for i in range(200)]


def test_cancelling_a_queued_task_with_max_tasks_per_child(ctx, tmp_path):
    gate = tmp_path / "gate"
    with pool.ProcessPool(1, mp_context=ctx, max_tasks_per_child=1) as p:
        running = p.submit(tasks.wait_for_file, str(gate), "first")
        cancelled = p.submit(tasks.square, 2)
        assert cancelled.cancel()
        gate.touch()
        assert running.result(30) == "first"
        assert p.submit(tasks.square, 3).result(30) == 9  # the next worker takes new work


def test_the_stdlibs_private_attributes_that_code_reads(ctx, tmp_path):
    p = pool.ProcessPool(2, mp_context=ctx)
    assert p._max_workers == 2 and p._mp_context is ctx and p._broken is False
    assert p._processes == {} and p._executor_manager_thread is None  # nothing started yet
    gate = tmp_path / "gate"
    futures = [p.submit(tasks.started_then, str(tmp_path), i, "wait") for i in range(2)]
    assert len(p._processes) == 2  # as the stdlib: the workers started for them are listed
    # Both tasks started in their workers, not only sent: a task its worker had not read
    # when it was killed would rightly run again elsewhere (seen under load).
    assert wait_until(lambda: len(tasks.started_inputs(str(tmp_path))) == 2, 60)
    assert all(f.running() for f in futures)
    processes = dict(p._processes)
    assert len(processes) == 2 and all(proc.pid == pid for pid, proc in processes.items())
    assert all(process_exists(pid) for pid in processes)
    thread = p._executor_manager_thread
    assert isinstance(thread, threading.Thread) and thread.is_alive()
    # Code that finds a worker through _processes and kills it: only its task fails.
    victim = next(iter(processes.values()))
    victim.terminate()
    gate.touch()
    outcomes = [f.exception(timeout=30) for f in futures]
    assert sum(isinstance(o, pool.WorkerDied) for o in outcomes) == 1 and None in outcomes
    assert p.submit(tasks.square, 3).result(timeout=30) == 9
    p.shutdown()
    thread.join(timeout=30)
    assert not thread.is_alive() and p._processes == {}
    assert not any(process_exists(pid) for pid in processes)
    for process in processes.values():  # still usable, as the stdlib's: not closed
        process.join()
        process.terminate()
        assert process.exitcode is not None

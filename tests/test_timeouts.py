"""Per-task timeouts and stopping a running task: the task ends, its worker and process
group are gone, and the pool carries on."""

from __future__ import annotations

import concurrent.futures as cf
import re
import subprocess
import sys
import threading
import time

import pytest

import pool
import tasks
from helpers import process_exists, wait_until


@pytest.mark.isolated
def test_a_task_stuck_in_c_holding_the_gil_times_out_with_its_stack(ctx, tmp_path):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        future = p.schedule(tasks.stuck_in_c_holding_the_gil, (str(tmp_path),), timeout=0.5)
        error = future.exception(60)
        assert isinstance(error, pool.TaskTimeout) and isinstance(error, TimeoutError)
        (pid,) = tasks.announced_pids(str(tmp_path))
        assert error.pid == pid and error.timeout == 0.5 and error.task.task_id == 1
        # The parent asked for the stack and got it: the frame it was stuck in, first.
        assert "in stuck_in_c_holding_the_gil" in error.stack
        # (re.match is re.prefixmatch from 3.15: either name is the frame it was stuck in)
        assert re.search(r"in (prefix)?match$", error.stack.splitlines()[1]), error.stack
        assert "pool-worker-watchdog" not in error.stack and "_watch_parent" not in error.stack
        assert "ran longer than its timeout of 0.5 s" in str(error)
        assert not process_exists(pid)  # reaped before the future failed
        # The slot is refilled and the next task runs normally.
        assert p.submit(tasks.pid_of_worker).result(60) != pid


@pytest.mark.isolated
def test_the_pool_wide_timeout_applies_to_submit_and_map_and_schedule_overrides_it(ctx):
    with pool.ProcessPool(2, mp_context=ctx, task_timeout=0.3) as p:
        assert isinstance(p.submit(tasks.sleep_then, 30).exception(60), pool.TaskTimeout)
        with pytest.raises(pool.TaskTimeout):
            list(p.map(tasks.sleep_then, [0, 30]))
        assert p.schedule(tasks.sleep_then, (0.6, "no limit"), timeout=None).result(60) == "no limit"
        assert p.schedule(tasks.sleep_then, (0.6,), {"value": "longer"},
                          timeout=10).result(60) == "longer"
        assert p.submit(tasks.square, 7).result(60) == 49


@pytest.mark.isolated
def test_a_timeout_counts_from_when_the_task_starts_running(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        p.submit(tasks.square, 1).result(60)  # the worker is up
        first = p.submit(tasks.sleep_then, 1.0, "first")
        # Queued behind a 1 s task: its 0.6 s only start counting once it runs.
        second = p.schedule(tasks.sleep_then, (0.1, "second"), timeout=0.6)
        assert (first.result(60), second.result(60)) == ("first", "second")


def test_timeouts_are_checked_at_the_call_site():
    with pytest.raises(ValueError):
        pool.ProcessPool(1, task_timeout=0)
    with pytest.raises(TypeError):
        pool.ProcessPool(1, task_timeout="1")
    with pytest.raises(ValueError):
        pool.ProcessPool(1, terminate_grace=float("nan"))
    with pool.ProcessPool(1) as p:
        with pytest.raises(ValueError):
            p.schedule(tasks.square, (1,), timeout=-1)
        with pytest.raises(TypeError):
            p.schedule(tasks.square, (1,), timeout=True)


@pytest.mark.isolated
def test_stop_ends_a_running_task_cancelled_and_wakes_its_waiters(ctx, tmp_path):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        running = p.submit(tasks.hang, str(tmp_path))
        other = p.submit(tasks.sleep_then, 0.5, "other")
        assert wait_until(lambda: tasks.announced_pids(str(tmp_path)), 60)
        (pid,) = tasks.announced_pids(str(tmp_path))
        assert running.cancel() is False  # cancel() keeps the stdlib's meaning
        woken = []

        def blocked_in_result():
            try:
                running.result()
            except BaseException as exc:
                woken.append(exc)

        waiters = [threading.Thread(target=lambda: woken.append(cf.wait([running]))),
                   threading.Thread(target=lambda: woken.append(list(cf.as_completed([running])))),
                   threading.Thread(target=blocked_in_result)]
        for thread in waiters:
            thread.start()
        assert running.stop() is True
        for thread in waiters:
            thread.join(30)
        assert len(woken) == 3
        assert running.cancelled()
        assert any(isinstance(w, cf.CancelledError) for w in woken)
        with pytest.raises(cf.CancelledError):
            running.result(0)
        assert not process_exists(pid)
        assert other.result(60) == "other"  # the other worker's task was untouched
        assert p.submit(tasks.pid_of_worker).result(60) != pid


@pytest.mark.isolated
def test_stop_cancels_a_queued_task_and_is_false_for_a_finished_one(ctx, tmp_path):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        done = p.submit(tasks.square, 3)
        assert done.result(60) == 9 and done.stop() is False and done.result() == 9
        blocker = p.submit(tasks.hang, str(tmp_path))
        # Too large to wait in the worker's pipe behind the blocker: it stays in the pool's
        # queue, where stopping it is cancelling it, at once.
        queued = p.submit(tasks.identity, b"x" * 10_000)
        ran = []
        queued.add_done_callback(ran.append)
        assert queued.stop() is True and queued.cancelled() and ran == [queued]
        assert blocker.stop() is True
        assert wait_until(blocker.cancelled, 30)
        assert p.submit(tasks.square, 5).result(60) == 25


@pytest.mark.isolated
def test_a_stopped_task_ends_cancelled_even_if_it_finishes_first(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        futures = [p.submit(tasks.sleep_then, 0.001 * (i % 3), i) for i in range(60)]
        stopped = [f for f in futures[::3] if f.stop()]
        for future in futures:
            cf.wait([future], 60)
        assert all(f.cancelled() for f in stopped)  # stop() returning True is a promise
        assert all(f.result() == i for i, f in enumerate(futures) if f not in stopped)


def test_a_caller_waiting_for_a_result_takes_no_lock_the_dispatcher_needs():
    # A Ctrl-C can leave a lock taken inside a Python-level __enter__ for good; the
    # dispatcher once blocked for ever in set_result() on the lock of an interrupted wait.
    # So a caller waiting for a result must not take the future's lock before it is done
    # (the plain lock its methods take, which the Condition stdlib code asks for wraps).
    from pool._futures import PoolFuture
    future = PoolFuture()
    real = future._lock
    taken_while_pending = []

    class Spy:
        def _note(self):
            if future._state not in ("CANCELLED", "CANCELLED_AND_NOTIFIED", "FINISHED"):
                taken_while_pending.append(threading.current_thread().name)

        def __enter__(self):
            self._note()
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

        def acquire(self, *args, **kwargs):
            self._note()
            return real.acquire(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    future._lock = Spy()
    waiters = [threading.Thread(target=future.result, name="result"),
               threading.Thread(target=future.exception, name="exception"),
               threading.Thread(target=lambda: future.result(60), name="result-timeout")]
    for waiter in waiters:
        waiter.start()
    # All three are waiting (or, as a wait through the future's lock would, have taken it).
    assert wait_until(lambda: taken_while_pending or len(future._wakers) == 3, 10)
    future.set_result(7)  # (the dispatcher's side takes the lock, of course)
    for waiter in waiters:
        waiter.join(10)
    assert not any(w.is_alive() for w in waiters)
    assert [name for name in taken_while_pending if name != "MainThread"] == []
    assert future.result() == 7


def test_a_future_builds_its_condition_only_for_stdlib_code_that_asks():
    # A Condition (an RLock and a dozen Python objects) per task was a measurable share of
    # submit(); the stdlib's wait()/as_completed() and Future's own methods still get one,
    # over the very lock the future's methods take, and are woken through it.
    from pool._futures import PoolFuture
    plain = PoolFuture()
    plain.set_running_or_notify_cancel()
    plain.set_result(3)
    assert plain.result() == 3 and plain.exception() is None and plain.done()
    assert plain._made_condition is None

    waited = PoolFuture()
    done = []
    waiter = threading.Thread(target=lambda: done.append(cf.wait([waited], 60)))
    waiter.start()
    assert wait_until(lambda: waited._waiters, 10)  # wait() is installed, under the lock
    waited.set_result(4)
    waiter.join(10)
    assert not waiter.is_alive() and done[0].done == {waited}
    assert waited._made_condition is not None
    assert waited._condition._lock is waited._lock  # (one lock for both)

    # Future's own methods, called on a pool future, wait on that Condition.
    through_base = PoolFuture()
    results = []
    reader = threading.Thread(target=lambda: results.append(cf.Future.result(through_base, 60)))
    reader.start()
    assert wait_until(lambda: through_base._made_condition is not None
                      and through_base._made_condition._waiters, 10)
    through_base.set_result(5)
    reader.join(10)
    assert results == [5]
    assert list(cf.as_completed([through_base], 10)) == [through_base]


def test_polling_a_result_with_a_timeout_leaves_nothing_behind():
    from pool._futures import PoolFuture
    future = PoolFuture()
    for _ in range(100):
        with pytest.raises(cf.TimeoutError):
            future.result(0)
        with pytest.raises(cf.TimeoutError):
            future.exception(0.001)
    assert future._wakers == []
    future.set_result(3)
    assert future.result(0) == 3 and future.exception(0) is None



# -- where a timed-out task was, when it has no Python frame ---------------------------------

@pytest.mark.isolated
def test_a_timed_out_builtin_called_directly_says_it_was_in_that_call(ctx):
    # ``time.sleep`` itself as the task: the worker's stack holds only the pool's frames,
    # which a report leaves out. A line says where it was instead of an empty stack.
    from pool._errors import IN_THE_MAPPED_FUNCTION, IN_THE_TASK_FUNCTION
    with pool.ProcessPool(1, mp_context=ctx, task_timeout=0.5) as p:
        error = p.submit(time.sleep, 60).exception(60)
        assert isinstance(error, pool.TaskTimeout)
        assert error.stack.splitlines()[1:] == [IN_THE_TASK_FUNCTION]
        assert ("\n  in time.sleep(60), which is not Python code (a built-in or C function "
                "called directly as the task)") in str(error)
        # Mapped over a chunk's inputs, it is the function called on each.
        with pytest.raises(pool.TaskTimeout) as mapped:
            list(p.map(time.sleep, [60, 60], chunksize=2))
        assert mapped.value.stack.splitlines()[1:] == [IN_THE_MAPPED_FUNCTION]


@pytest.mark.isolated
def test_a_timed_out_python_function_shows_its_own_frame_first(ctx):
    with pool.ProcessPool(1, mp_context=ctx, task_timeout=0.5) as p:
        error = p.submit(tasks.sleep_then, 60).exception(60)
        assert isinstance(error, pool.TaskTimeout)
        lines = error.stack.splitlines()
        assert lines[1].endswith(" in sleep_then") and lines[1].strip().startswith("File ")
        assert "which is not Python code" not in error.stack + str(error)


def test_the_command_line_says_where_a_timed_out_builtin_was():
    from pool._errors import IN_THE_MAPPED_FUNCTION
    proc = subprocess.run([sys.executable, "-m", "pool", "map", "--jsonl", "--timeout", "0.5",
                           "time:sleep"], input="60\n", capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.startswith("!TaskTimeout"), (proc.stdout, proc.stderr)
    where = proc.stderr.split("Where it was when the time ran out:\n")[1].splitlines()
    assert where[1] == IN_THE_MAPPED_FUNCTION, proc.stderr

"""Refill, start failures, internal failure, callbacks, and the pool's own end of life."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import pool
import tasks
from pool._core.start_failures import MAX_START_FAILURES
from helpers import (TESTS_DIR, START_METHODS, full_volume, process_exists, run_script,
                     wait_until)

THOUSAND_DEATHS = '''
def fds():
    return len(os.listdir("/proc/self/fd"))
def kids():
    return len(helpers.children_of(os.getpid()) - helpers.helper_pids())
def server_fds():  # the forkserver receives every worker's descriptors: it must not keep them
    from multiprocessing import forkserver
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return len(os.listdir(f"/proc/{pid}/fd")) if METHOD == "forkserver" else 0
def settled(p, name):
    # Both workers hold a task at once, so both are up and no start is in flight (in the
    # parent or the forkserver): descriptor counts are at rest. Then let them finish.
    both = [p.submit(tasks.wait_for_file, os.path.abspath(name)) for _ in range(2)]
    helpers.wait_until(lambda: all(f.running() for f in both), 60)
    counts = fds(), kids(), server_fds()
    open(name, "w").close()
    [f.result(60) for f in both]
    return counts
with pool.ProcessPool(2, mp_context=CTX) as p:
    p.submit(tasks.exit_hard, 3).exception(60)        # one death so every path has run
    warm = settled(p, "gate-warm")
    deaths = [p.submit(tasks.exit_hard, 3) for _ in range(DEATHS)]
    died = sum(isinstance(f.exception(120), pool.WorkerDied) for f in deaths)
    after = settled(p, "gate-after")
report(died=died, fds_warm=warm[0], fds_after=after[0], kids_warm=warm[1],
       kids_after=after[1], server_warm=warm[2], server_after=after[2])
'''


@pytest.mark.timeout(420)  # spawn needs ~45 s on an idle 2-core machine
@pytest.mark.parametrize("method", START_METHODS)
def test_a_thousand_deaths_leave_no_descriptors_or_children(method, tmp_path):
    # A thousand where this Python runs the method in full (helpers.full_volume); 150
    # elsewhere, where a descriptor or child kept per death shows as plainly.
    deaths = 1000 if full_volume(method) else 150
    facts, _ = run_script(f"DEATHS = {deaths}\n" + THOUSAND_DEATHS, method, tmp_path,
                          timeout=400)
    assert facts["died"] == deaths
    assert facts["fds_after"] == facts["fds_warm"]
    assert facts["server_after"] == facts["server_warm"]
    # Under fork and spawn the workers are our children; under forkserver, the server's.
    assert facts["kids_after"] == facts["kids_warm"] <= 2
    assert facts["children_left"] == [] and facts["threads_left"] == []


@pytest.mark.isolated
def test_idle_worker_death_is_replaced_and_logged(ctx, caplog):
    caplog.set_level(logging.WARNING, logger="pool")
    with pool.ProcessPool(1, mp_context=ctx) as p:
        first = p.submit(tasks.pid_of_worker).result(30)
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: any(f"idle worker pid {first} died" in r.getMessage()
                                      for r in caplog.records))
        second = p.submit(tasks.pid_of_worker).result(30)  # no future failed
        assert second != first


def test_workers_lead_their_own_process_groups(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        for pid in set(p.map(tasks.pid_of_worker, range(8))):
            assert os.getpgid(pid) == pid


def test_failing_initializer_stops_respawning_and_fails_waiting_futures(ctx, tmp_path):
    log = tmp_path / "starts"
    with pool.ProcessPool(2, mp_context=ctx, initializer=tasks.append_then_fail,
                          initargs=(str(log),)) as p:
        futures = [p.submit(tasks.square, i) for i in range(5)]
        for future in futures:
            error = future.exception(60)
            assert isinstance(error, pool.InitializerError)
            assert isinstance(error, cf.process.BrokenProcessPool)
            assert "initializer says no" in str(error)
            assert "in append_then_fail" in str(error)  # the remote traceback, as text
            assert isinstance(error.__cause__, RuntimeError)  # and as the exception itself
        with pytest.raises(pool.InitializerError):
            p.submit(tasks.square, 1)
    starts = log.read_text().count("start")
    assert MAX_START_FAILURES <= starts <= MAX_START_FAILURES + 2


@pytest.mark.isolated
def test_initializer_that_kills_its_worker_breaks_the_pool_without_a_fork_loop(ctx):
    with pool.ProcessPool(1, mp_context=ctx, initializer=tasks.exit_hard, initargs=(4,)) as p:
        error = p.submit(tasks.square, 2).exception(60)
    assert isinstance(error, pool.InitializerError)
    assert "ended while starting (exit code 4)" in str(error)


def test_a_broken_pool_finishes_its_running_task_then_ends_by_itself(ctx, tmp_path):
    # The first worker starts and runs a task; every later one fails to start: the pool
    # breaks, fails what waits, lets the running task finish, then ends its loop and its
    # processes with no shutdown() called (nothing is left for it to do).
    gate, pids = tmp_path / "gate", tmp_path / "pids"
    pids.mkdir()
    p = pool.ProcessPool(2, mp_context=ctx, initializer=tasks.succeed_first_time,
                         initargs=(str(tmp_path / "started"),))
    running = p.submit(tasks.announce_then_wait, str(pids), str(gate), "ran")
    assert wait_until(lambda: tasks.announced_pids(str(pids)), 60)
    (worker,) = tasks.announced_pids(str(pids))
    waiting = p.submit(tasks.square, 3)  # starts the second worker, which cannot start
    assert isinstance(waiting.exception(60), pool.InitializerError)
    with pytest.raises(pool.InitializerError):
        p.submit(tasks.square, 4)
    assert not running.done()
    gate.touch()
    assert running.result(60) == "ran"
    thread = p._executor_manager_thread
    assert thread is not None
    thread.join(60)
    assert not thread.is_alive() and p._processes == {}
    assert wait_until(lambda: not process_exists(worker), 30)
    assert "broken" in repr(p)
    with pytest.raises(pool.InitializerError):
        p.submit(tasks.square, 5)
    p.shutdown()  # returns at once: everything has ended


FORKSERVER_PRELOAD = '''
from multiprocessing import forkserver
CTX.set_forkserver_preload(["__main__", "json"])  # the user's own list, kept first
with pool.ProcessPool(1, mp_context=CTX) as p:
    # Not started before the first task: it takes the environment the workers get.
    started_early = forkserver._forkserver._forkserver_pid is not None
    p.submit(tasks.square, 2).result(60)
    first = list(forkserver._forkserver._preload_modules)
    server = forkserver._forkserver._forkserver_pid
CTX.set_forkserver_preload(["__main__"])  # changed after the forkserver started
with pool.ProcessPool(1, mp_context=CTX) as p:
    p.submit(tasks.square, 2).result(60)
report(first=first, later=list(forkserver._forkserver._preload_modules),
       started_early=started_early,
       same_server=server == forkserver._forkserver._forkserver_pid)
'''


def test_the_forkserver_preloads_the_worker_after_the_users_modules(tmp_path):
    # A worker forked from a forkserver that has imported pool._worker.main starts at the
    # cost of a fork; the user's preload list comes first, and a running forkserver is left
    # alone. What only some tasks need (cloudpickle, tblib, the pool's errors) is not
    # preloaded: a script's first result would wait for it.
    facts, _ = run_script(FORKSERVER_PRELOAD, "forkserver", tmp_path, timeout=90)
    assert facts["first"] == ["__main__", "json", "pool._worker.main"]
    assert facts["later"] == ["__main__"] and facts["same_server"]
    assert facts["started_early"] is False


FORK_AFTER_A_PRINT = '''
import io
# Buffered streams, as a program writing to a pipe has them (whatever PYTHONUNBUFFERED
# says here).
sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                              line_buffering=True)
import logging
logging.basicConfig(format="%(message)s")  # a handler that holds sys.stderr, made before
real_fork, forks = os.fork, []
def fork_after_a_print():
    # What another thread of the parent printed after multiprocessing flushed the streams
    # (it does, just before it forks) and before the fork: still in the buffers.
    sys.stdout.write("MARK-OUT\\n")
    sys.stderr.write("MARK-ERR ")  # (no line end: it stays in stderr's line buffer)
    forks.append(1)
    return real_fork()
os.fork = fork_after_a_print
with pool.ProcessPool(2, mp_context=CTX) as p:
    assert sorted(p.map(tasks.square, range(6))) == [0, 1, 4, 9, 16, 25]
    p.submit(tasks.sigkill_self).exception(60)  # a worker dies, one more is forked
    assert p.submit(tasks.square, 3).result(60) == 9
    p.submit(tasks.log_warning, "TASK-LOG").result(60)  # through the inherited handler
os.fork = real_fork
sys.stderr.write("\\n")
report(forks=len(forks))
'''


def test_a_forked_worker_does_not_print_what_the_parent_had_buffered(tmp_path):
    # The pool forks from its dispatcher thread, while other threads of the parent may be
    # printing: a worker that kept the buffers it inherited printed the parent's lines
    # again when it exited (seen as duplicated lines of the demo under fork).
    facts, proc = run_script(FORK_AFTER_A_PRINT, "fork", tmp_path, timeout=90)
    assert facts["forks"] >= 3
    assert proc.stdout.count("MARK-OUT") == facts["forks"], proc.stdout
    assert proc.stderr.count("MARK-ERR") == facts["forks"], proc.stderr
    assert proc.stderr.count("TASK-LOG") == 1, proc.stderr


UNBUFFERED_FORKED = '''
import io
# As under python -u: text goes to the descriptor at once.
sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
with pool.ProcessPool(1, mp_context=CTX) as p:
    p.submit(tasks.print_then_die, "TASK-OUT").exception(60)
report(done=True)
'''


def test_a_forked_worker_keeps_unbuffered_streams_unbuffered(tmp_path):
    # What a task printed before its worker died is there: the streams a forked worker
    # inherits are emptied, not replaced by buffered ones.
    facts, proc = run_script(UNBUFFERED_FORKED, "fork", tmp_path, timeout=90)
    assert facts["done"] and "TASK-OUT" in proc.stdout, proc.stdout


SIGNAL_CANCELS_DURING_WAIT = '''
from pool._futures import PoolFuture
future = PoolFuture()
cancelled = []
signal.signal(signal.SIGUSR1, lambda *_: cancelled.append(future.cancel()))
with future._condition:  # as concurrent.futures.wait() holds it while it installs a waiter
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0)  # (the handler runs here, on this thread, with the lock held)
report(cancelled=cancelled)
'''


def test_a_signal_handler_may_cancel_a_future_whose_lock_its_thread_holds(tmp_path):
    # Future's lock is reentrant (its Condition's RLock): a handler that cancels a future
    # while wait() or as_completed() holds that future's lock on the same thread must not
    # block on it.
    facts, _ = run_script(SIGNAL_CANCELS_DURING_WAIT, "fork", tmp_path, timeout=30)
    assert facts["cancelled"] == [True]


def test_a_flaky_initializer_is_retried(ctx, tmp_path):
    marker = tmp_path / "failed-once"
    with pool.ProcessPool(1, mp_context=ctx, initializer=tasks.fail_first_time,
                          initargs=(str(marker),)) as p:
        assert p.submit(tasks.square, 5).result(60) == 25


INTERNAL_FAILURE = '''
gate = os.path.abspath("gate")
os.mkdir("pids")
p = pool.ProcessPool(2, mp_context=CTX)
running = [p.submit(tasks.announce_then_wait, "pids", gate) for _ in range(2)]
queued = [p.submit(tasks.square, i) for i in range(3)]
helpers.wait_until(lambda: len(tasks.announced_pids("pids")) == 2, 60)
pids = tasks.announced_pids("pids")
# Cancelled by its caller just before the failure (the loop has not taken it out of the
# queue yet): it must end cancelled, and be seen to by wait().
cancelled = p.submit(tasks.square, 9)
assert p.stats().queued == 4  # (the loop has queued it)
assert cancelled.cancel()
p._dispatcher._loop._injected_fault = RuntimeError("injected")
p._dispatcher._wakeup.wake()
errors = [f.exception(30) for f in running + queued]
import concurrent.futures
seen_cancelled = cancelled in concurrent.futures.wait([cancelled], timeout=10).done
try:
    p.submit(tasks.square, 1)
    later = None
except pool.PoolInternalError as exc:
    later = str(exc)
p.shutdown()
report(errors=[type(e).__name__ for e in errors],
       causes=[repr(e.__cause__) for e in errors], later=later,
       alive=[pid for pid in pids if helpers.process_exists(pid)],
       seen_cancelled=seen_cancelled, stats=p.stats().cancelled)
'''


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dispatcher_failure_resolves_every_future_and_kills_workers(method, tmp_path):
    facts, _ = run_script(INTERNAL_FAILURE, method, tmp_path, timeout=60)
    assert facts["errors"] == ["PoolInternalError"] * 5
    assert all("RuntimeError('injected')" == cause for cause in facts["causes"])
    assert "injected" in facts["later"]
    assert facts["alive"] == [] and facts["children_left"] == []
    assert facts["seen_cancelled"] and facts["stats"] == 1


def test_concurrent_shutdowns_of_a_pool_that_never_started_all_return():
    # The last shutdown() of a pool with no thread ends it; two at once must not both try
    # (the second used to raise InvalidStateError, setting ``finished`` twice).
    class SlowToAnswer(cf.Future):  # widens the window between asking and setting
        def done(self) -> bool:
            answer = super().done()
            time.sleep(0.005)
            return answer

    for _ in range(20):
        p = pool.ProcessPool(1)
        p._dispatcher.finished = SlowToAnswer()
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def close() -> None:
            barrier.wait()
            try:
                p.shutdown()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=close) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert errors == [] and p._dispatcher.finished.done()
        with pytest.raises(RuntimeError, match="after shutdown"):
            p.submit(tasks.square, 1)


def test_a_submission_refused_after_the_loop_ended_is_failed_or_cancelled_and_heard_of():
    # What reaches the loop after its pool closed (a broken pool ends by itself while a
    # caller is submitting) or failed: failed, or cancelled if its caller cancelled it, and
    # in both cases seen by wait() (a cancelled future needs notifying, not resolving).
    from pool._dispatcher.commands import Submission
    p = pool.ProcessPool(1)
    performer = p._dispatcher._loop._performer  # let go of by the pool once it has ended
    p.shutdown()
    futures = [pool.PoolFuture(), pool.PoolFuture()]
    assert futures[1].cancel()
    for task_id, future in enumerate(futures, 1):
        performer.refuse(Submission(pool.TaskInfo(task_id, tasks.square, (1,), {}), future,
                                    [], 0, None))
    assert cf.wait(futures, timeout=5).not_done == set()
    with pytest.raises(RuntimeError, match="after shutdown"):
        futures[0].result()
    assert futures[1].cancelled()


def test_callbacks_never_run_on_the_dispatcher_thread(ctx, caplog):
    seen = []
    release = threading.Event()
    with pool.ProcessPool(2, mp_context=ctx) as p:
        dispatcher = p._dispatcher.thread
        blocked = p.submit(tasks.square, 1)
        blocked.add_done_callback(lambda f: (seen.append(threading.current_thread()),
                                             release.wait(30)))
        raising = p.submit(tasks.square, 2)
        raising.add_done_callback(lambda f: (_ for _ in ()).throw(SystemExit("from callback")))
        raising.add_done_callback(lambda f: (_ for _ in ()).throw(KeyboardInterrupt()))
        raising.add_done_callback(lambda f: seen.append("after the raising ones"))
        # The first callback is blocked; results keep coming regardless.
        assert [p.submit(tasks.square, i).result(30) for i in range(5)] == [0, 1, 4, 9, 16]
        release.set()
    assert "after the raising ones" in seen
    assert all(t is not dispatcher for t in seen if isinstance(t, threading.Thread))
    assert wait_until(lambda: sum("raised" in r.getMessage() for r in caplog.records) == 2)


def test_every_callback_has_run_when_shutdown_returns(ctx):
    ran = []
    with pool.ProcessPool(2, mp_context=ctx) as p:
        for i in range(50):
            p.submit(tasks.square, i).add_done_callback(
                lambda f: (time.sleep(0.01), ran.append(f.result())))  # slow callbacks
    assert sorted(ran) == sorted(i * i for i in range(50))


def test_future_runs_callbacks_through_invoke_callbacks():
    # PoolFuture keeps callbacks off the dispatcher by overriding this private method.
    assert callable(getattr(cf.Future, "_invoke_callbacks", None))


def test_a_pool_dropped_without_shutdown_finishes_and_cleans_up(ctx):
    p = pool.ProcessPool(1, mp_context=ctx)
    future = p.submit(tasks.square, 6)
    thread = p._dispatcher.thread
    del p  # the finalizer asks for a shutdown that lets submitted work finish
    assert future.result(30) == 36
    thread.join(30)
    assert not thread.is_alive()


EXIT_WITHOUT_SHUTDOWN = '''
p = pool.ProcessPool(1, mp_context=CTX)
f = p.submit(tasks.sleep_then, 0.2, "late")
pid = p.submit(tasks.pid_of_worker).result(30)
print("WORKER", pid, flush=True)
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_interpreter_exit_waits_for_submitted_work_and_reaps(method, tmp_path):
    _, proc = run_script(EXIT_WITHOUT_SHUTDOWN, method, tmp_path, timeout=60)
    pid = int(proc.stdout.split("WORKER")[1].split()[0])
    assert not process_exists(pid)
    assert "Traceback" not in proc.stderr


EXIT_WITH_A_CALLBACK = '''
p = pool.ProcessPool(1, mp_context=CTX)
p.submit(tasks.square, 1).result(30)  # the worker is up: only the callback is left to start
f = p.submit(tasks.sleep_then, 0.3, "late")
f.add_done_callback(lambda fut: print("CALLBACK", fut.result(), flush=True))
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_a_callback_of_work_finished_during_exit_still_runs(method, tmp_path):
    # The first callback thread is needed only once the exit has begun, when 3.12 lets no
    # thread start: the exit itself runs the callback (it used to be lost, and the exit
    # failed with "cannot join thread before it is started").
    _, proc = run_script(EXIT_WITH_A_CALLBACK, method, tmp_path, timeout=60)
    assert "CALLBACK late" in proc.stdout
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


SUBMIT_AND_RETURN = '''
import multiprocessing, sys
sys.path[:0] = [{tests!r}]
import pool

def work(x):  # a function of __main__, sent by reference: workers import this script
    return x * 7

if __name__ == "__main__":
    p = pool.ProcessPool(1, mp_context=multiprocessing.get_context({method!r}))
    p.submit(work, 6).add_done_callback(lambda f: print("RESULT", f.result(), flush=True))
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_work_submitted_as_the_script_returns_runs_in_a_worker_started_during_exit(
        method, tmp_path):
    # The worker starts once the script has returned, when CPython has already removed
    # __main__.__file__: without it, the worker would not import the script, and `work`
    # would not be found there.
    script = tmp_path / "submit_and_return.py"
    script.write_text(SUBMIT_AND_RETURN.format(tests=str(TESTS_DIR), method=method))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    if method == "fork" and "can't fork at interpreter shutdown" in proc.stderr:
        # 3.12 forks nothing once the script has returned: the task fails, and says why.
        assert sys.version_info[:2] == (3, 12), proc.stderr
        assert "does not fork once the main script has returned" in proc.stderr
        return
    assert "RESULT 42" in proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("method", START_METHODS)
def test_workers_exit_when_the_parent_is_killed(method, tmp_path):
    body = '''
p = pool.ProcessPool(2, mp_context=CTX)
pids = sorted(set(p.map(tasks.pid_of_worker, range(4))) | {p.submit(tasks.pid_of_worker).result(30)})
gate = os.path.abspath("gate")
busy = [p.submit(tasks.wait_for_file, gate) for _ in range(2)]  # mid-task when we die
print("WORKERS", json.dumps(pids), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''
    _, proc = run_script(body, method, tmp_path, timeout=60, expect_exit=-signal.SIGKILL)
    pids = __import__("json").loads(proc.stdout.split("WORKERS")[1].splitlines()[0])
    assert pids
    assert wait_until(lambda: not any(process_exists(pid) for pid in pids), 5), pids


@pytest.mark.isolated
def test_a_task_sent_to_a_worker_that_dies_before_reading_it_runs_elsewhere(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        dying = p.submit(tasks.reply_then_die, "last words")
        # Sent the moment the reply arrives, while the worker is exiting: never read.
        following = [p.submit(tasks.square, i) for i in range(5)]
        assert dying.result(30) == "last words"
        assert [f.result(30) for f in following] == [0, 1, 4, 9, 16]


def test_map_pickles_the_function_once(ctx):
    tasks.CountsPickling.pickled = 0
    with pool.ProcessPool(2, mp_context=ctx) as p:
        assert list(p.map(tasks.CountsPickling(), range(50))) == list(range(1, 51))
        assert list(p.map(tasks.CountsPickling(), range(50), chunksize=7)) == list(range(1, 51))
    assert tasks.CountsPickling.pickled == 2


@pytest.mark.parametrize("method", START_METHODS)
def test_functions_of_an_unimportable_main_work(method):
    code = (f"import multiprocessing as mp, pool\n"
            f"scale = 3\n"
            f"def triple(x):\n    return x * scale\n"
            f"if __name__ == '__main__':\n"
            f"    with pool.ProcessPool(2, mp_context=mp.get_context({method!r})) as p:\n"
            f"        print(list(p.map(triple, range(4))), p.submit(lambda: 'lambda').result())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(TESTS_DIR))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 3, 6, 9] lambda"


def test_large_payloads_cross_both_ways_intact(ctx):
    size = 24 * 1024 * 1024
    with pool.ProcessPool(2, mp_context=ctx) as p:
        data = p.submit(tasks.make_bytes, size).result(60)
        assert data == tasks.make_bytes(size)
        assert p.submit(tasks.byte_sum, data).result(60) == tasks.byte_sum(data)


@pytest.mark.isolated
def test_a_forked_copy_of_the_parent_cannot_use_the_pool():
    with pool.ProcessPool(1) as p:
        p.submit(tasks.square, 2).result(30)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what submit did, and leave without cleanup
            try:
                p.submit(tasks.square, 2)
                message = b"no error"
            except RuntimeError as exc:
                message = str(exc).encode()
            os.write(write_end, message)
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            message = reader.read().decode()
        os.waitpid(pid, 0)
    assert "cannot use it" in message


def test_a_task_can_run_a_pool_of_its_own(ctx, start_method):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        assert p.submit(tasks.use_inner_pool, start_method).result(60) == [0, 1, 4, 9, 16]


@pytest.mark.isolated
def test_killing_a_worker_also_ends_the_workers_of_its_inner_pool(ctx, start_method, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    with pool.ProcessPool(1, mp_context=ctx) as p:
        outer = p.submit(tasks.pid_of_worker).result(60)
        nested = p.submit(tasks.use_inner_pool, start_method, str(pid_dir), str(tmp_path / "gate"))
        assert wait_until(lambda: len(tasks.announced_pids(str(pid_dir))) == 2, 60)
        inner = tasks.announced_pids(str(pid_dir))
        os.kill(outer, signal.SIGKILL)
        assert isinstance(nested.exception(60), pool.WorkerDied)
        # The inner workers lead groups of their own; their lifeline was the outer worker.
        assert wait_until(lambda: not any(process_exists(pid) for pid in inner), 5), inner


FORKED_CHILD_POOL = '''
with pool.ProcessPool(1, mp_context=CTX) as p:
    parent_worker = p.submit(tasks.pid_of_worker).result(60)
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            with pool.ProcessPool(1, mp_context=CTX) as own:
                os.write(writing, str(own.submit(tasks.square, 7).result(60)).encode())
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as pipe:
        got = pipe.read()
    os.waitpid(child, 0)
    same = p.submit(tasks.pid_of_worker).result(60) == parent_worker
report(got=got, same=same)
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_a_forked_child_of_a_pools_process_runs_a_pool_of_its_own(method, tmp_path):
    # Under forkserver the child must not use the parent's server (multiprocessing's
    # ensure_running() fails on it there: ChildProcessError); it starts its own.
    facts, _ = run_script(FORKED_CHILD_POOL, method, tmp_path, timeout=90)
    assert facts == {"got": "49", "same": True, "children_left": [], "threads_left": []}


# -- cancel() as the stdlib's: only the future's own lock, callbacks outside it -----------


def test_a_done_callback_of_a_cancelled_future_may_wait_for_the_pool(ctx):
    # The callback runs with no lock held that the pool's thread needs: it can shut the
    # pool down and wait, while the pool reaches the cancelled task (it used to deadlock).
    ex = pool.ProcessPool(1, mp_context=ctx)
    running = ex.submit(tasks.sleep_then, 0.3, "first")
    queued = ex.submit(tasks.square, 2)
    after = ex.submit(tasks.square, 3)
    returned = threading.Event()

    def shut_down(_):
        ex.shutdown(wait=True)
        returned.set()

    queued.add_done_callback(shut_down)
    assert queued.cancel()
    assert returned.is_set()
    assert running.result(0) == "first" and after.result(0) == 9


def test_shutdown_from_a_done_callback_leaves_no_callback_thread(ctx):
    ex = pool.ProcessPool(1, mp_context=ctx)
    returned = threading.Event()
    ex.submit(tasks.square, 1).add_done_callback(
        lambda _: (ex.shutdown(wait=True), returned.set()))
    assert returned.wait(60)
    # (the leak check fails the test if the callback thread is still there)
    assert wait_until(lambda: not [t for t in threading.enumerate()
                                   if t.name.startswith(ex._dispatcher.name)], 10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_cancel_in_a_forked_child_takes_no_lock_of_the_parents_pool(ctx):
    ex = pool.ProcessPool(1, mp_context=ctx)
    blocker = ex.submit(tasks.sleep_then, 0.5)
    queued = ex.submit(tasks.square, 2)
    held, release = threading.Event(), threading.Event()

    def submitting():  # another thread inside submit() at the fork: the lock is held
        with ex._dispatcher._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=submitting)
    holder.start()
    assert held.wait(30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        child = os.fork()
    if child == 0:
        try:
            os._exit(0 if queued.cancel() else 1)  # the child's copy of the future
        finally:
            os._exit(2)
    release.set()
    holder.join()
    deadline = time.monotonic() + 30
    while (status := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if status[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("cancel() hung in the forked child")
    assert os.waitstatus_to_exitcode(status[1]) == 0
    assert not queued.cancelled() and queued.result(60) == 4  # the parent's task is untouched
    assert blocker.result(60) is None
    ex.shutdown()

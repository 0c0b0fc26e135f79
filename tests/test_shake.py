"""The shake (``tests/shake.py``): a short one on every run of the suite, and each race it
found, pinned by a test that opens the race on purpose.

The long shake is run by hand (docs/development.rst, "The shake"); these keep its paths working and
its findings fixed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap

import pytest

import shake
from helpers import (REPO_DIR, START_METHODS, communicate_or_kill, session_members,
                     wait_until)


def run_to_the_end(text, tmp_path, *args, new_session=False):
    """Runs ``text`` as a script in a child interpreter (under a hard timeout); returns its
    status, stdout and stderr."""
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(text))
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            start_new_session=new_session)
    return communicate_or_kill(proc, timeout=60)


def test_every_point_in_the_code_is_listed_and_every_listed_point_is_in_the_code():
    from pool import _shake
    package = REPO_DIR / "pool"
    used = set()
    for source in set(package.rglob("*.py")) - {package / "_shake.py"}:
        used |= set(re.findall(r'_shake\.pause\("([a-z_.]+)"\)', source.read_text()))
    assert used == set(_shake.POINTS)


def test_a_setting_that_cannot_be_read_fails_loudly():
    from pool import _shake
    with pytest.raises(ValueError, match="no point named"):
        _shake.configure("at=nowhere:1")
    with pytest.raises(ValueError, match="cannot read"):
        _shake.configure("seed")
    _shake.configure("")
    assert not _shake.on


# A Ctrl-C to the terminal's process group reaches every process of the pool. The
# scenario's main module, imported as ``__mp_main__`` by a process the pool starts (a
# spawned worker; the forkserver, which imports it before it ignores SIGINT), sends it
# SIGINT as it is imported: the moment a Ctrl-C is most likely to find it unprotected.
CTRL_C_WHILE_STARTING = '''
import os, signal, sys
if __name__ == "__mp_main__" and os.environ.get("CTRL_C_ONCE") != "done":
    os.environ["CTRL_C_ONCE"] = "done"   # (the forkserver's workers inherit it)
    os.kill(os.getpid(), signal.SIGINT)
if __name__ == "__main__":
    import multiprocessing
    import pool
    context = multiprocessing.get_context(sys.argv[1])
    with pool.ProcessPool(2, mp_context=context) as p:
        print(sum(p.map(abs, range(100))), flush=True)
'''


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_ctrl_c_that_lands_while_a_pool_process_starts_kills_none(method, tmp_path):
    code, out, err = run_to_the_end(CTRL_C_WHILE_STARTING, tmp_path, method)
    assert (code, out) == (0, "4950\n"), err
    assert "KeyboardInterrupt" not in err and "refused to start" not in err, err


# A program that handles SIGTERM (to finish cleanly, as ``python -m pool map`` does) gets
# one sent to its whole process group: it must reach the program, not the pool. The
# forkserver is in that group (workers lead groups of their own).
SIGTERM_TO_A_GROUP_THAT_HANDLES_IT = '''
import multiprocessing, os, signal, sys, threading
import pool
from pool import _compat
if __name__ == "__main__":
    received = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: received.set())
    with pool.ProcessPool(2, mp_context=multiprocessing.get_context("forkserver")) as p:
        assert p.submit(abs, -1).result() == 1
        server = _compat.forkserver_pid()
        os.killpg(0, signal.SIGTERM)
        assert received.wait(30)
        print(sum(p.map(abs, range(100))), flush=True)
        print("same forkserver", _compat.forkserver_pid() == server, flush=True)
'''


def test_a_sigterm_to_the_group_of_a_program_that_handles_it_leaves_the_pool_working(
        tmp_path):
    code, out, err = run_to_the_end(SIGTERM_TO_A_GROUP_THAT_HANDLES_IT, tmp_path, new_session=True)
    assert (code, out, err) == (0, "4950\nsame forkserver True\n", "")


# A forkserver that pool launched keeps the stop signals blocked for good. What else it
# forks (a user's Process, the stdlib's executors) must get them back: else terminate()
# leaves it running, and Ctrl-C never reaches it.
A_PROCESS_FROM_THE_POOLS_FORKSERVER = '''
import multiprocessing, time
import pool

def report_mask_then_wait(queue):
    with open("/proc/self/status") as status:
        queue.put(next(line.split()[1] for line in status if line.startswith("SigBlk:")))
    time.sleep(60)

if __name__ == "__main__":
    context = multiprocessing.get_context("forkserver")
    with pool.ProcessPool(1, mp_context=context) as p:
        p.submit(abs, 1).result()   # the forkserver is pool's
    queue = context.SimpleQueue()
    process = context.Process(target=report_mask_then_wait, args=(queue,))
    process.start()
    print(int(queue.get(), 16))
    process.terminate()
    process.join(30)
    print(process.exitcode)
'''


def test_what_the_pools_forkserver_forks_for_others_gets_the_stop_signals_back(tmp_path):
    code, out, err = run_to_the_end(A_PROCESS_FROM_THE_POOLS_FORKSERVER, tmp_path)
    assert (code, out) == (0, f"0\n{-signal.SIGTERM}\n"), err


# A worker whose parent is gone as it starts: its reply pipe has no reader. Its lifeline
# is held open here, so that it is the reply pipe it finds closed, not the lifeline.
A_WORKER_WITH_NO_ONE_TO_REPLY_TO = '''
import multiprocessing, os
from pool._worker.main import InheritedFd, WorkerSetup, worker_main
if __name__ == "__main__":
    task_r, task_w = os.pipe()
    reply_r, reply_w = os.pipe()
    lifeline_r, lifeline_w = os.pipe()
    os.close(reply_r)
    setup = WorkerSetup(task_fd=InheritedFd(task_r), reply_fd=InheritedFd(reply_w),
                        lifeline_fd=InheritedFd(lifeline_r), crash_fd=None, initializer=None,
                        max_tasks=None, max_memory=None, fds_to_close=(), forked=True)
    worker = multiprocessing.get_context("fork").Process(target=worker_main, args=(setup,))
    worker.start()
    worker.join(30)
    print(worker.exitcode)
'''


def test_a_worker_whose_parent_is_gone_as_it_starts_exits_without_a_word(tmp_path):
    code, out, err = run_to_the_end(A_WORKER_WITH_NO_ONE_TO_REPLY_TO, tmp_path)
    assert (code, out, err) == (0, "0\n", "")


# A program that ends with a pool still open, whose last task would run for ten minutes:
# the exit hook waits for it, and a Ctrl-C then stops it. A fixed delay at a point of the
# hook holds it there; the test sends the Ctrl-C once the hook says it is there.
EXIT_WITH_A_POOL_OPEN = shake.PRELUDE.format(tests=str(shake.TESTS_DIR)) + '''
if __name__ == "__main__":
    p = pool.ProcessPool(2, mp_context=CTX)
    p.submit(abs, 1).result()   # a worker is up
    FUTURES.extend(p.submit(tasks.sleep_then, LONG, i) for i in range(4))
'''


@pytest.mark.parametrize("point", ["exit.hook_entry", "exit.before_pools"])
def test_a_ctrl_c_at_the_start_of_the_exit_hook_still_stops_every_task(point, tmp_path):
    """A Ctrl-C before the hook's guard is printed by threading as ignored, and the hook is
    skipped: atexit's safety net stops the pools. Inside it, the hook stops them itself."""
    script = tmp_path / "scenario.py"
    script.write_text(EXIT_WITH_A_POOL_OPEN)
    env = dict(os.environ, POOL_SHAKE=f"at={point}:30,tell=1", SHAKE_METHOD="forkserver",
               PYTHONPATH=str(shake.TESTS_DIR))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), env=env,
                            start_new_session=True)
    try:
        assert proc.stderr is not None
        told = proc.stderr.readline()   # blocks until the hook is in its pause (30 s)
        assert told == f"pool shake: at {point}\n", told
        os.killpg(proc.pid, signal.SIGINT)
        code, out, err = communicate_or_kill(proc, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out == "FUTURES 4 0\n", err
    assert wait_until(lambda: not session_members(proc.pid), 10), session_members(proc.pid)
    if point == "exit.hook_entry":   # threading's words: the hook was skipped, the net acted
        assert shake.THREADING_IGNORED_IT.search(err), err
    else:
        assert "Exception ignored" not in err, err


@pytest.fixture(scope="module")
def short_shake():
    """Every path on every start method once, with a random signal at a random moment,
    beside one busy process per core; three runs at a time. (The long shake, with two per
    core, is the real test; this keeps every path of it working on every push, where CI
    runs two suites at once besides.)"""
    with shake.Busy(os.cpu_count() or 1):
        outcomes = shake.shake(len(shake.PATHS) * len(START_METHODS), list(START_METHODS),
                               list(shake.PATHS), seed=random.randrange(10**9), jobs=3,
                               report=False)
    return outcomes


@pytest.mark.timeout(600)   # the first pays for the whole shake: about 30 s
@pytest.mark.parametrize("path", shake.PATHS)
def test_a_short_shake(short_shake, path):
    outcomes = [o for o in short_shake if o.path == path]
    assert sorted(o.method for o in outcomes) == sorted(START_METHODS)
    failed = [o for o in outcomes if o.problems]
    assert not failed, "\n".join(
        f"{o.path}:{o.method}:{o.seed} (python tests/shake.py --replay it) {o.signal}: "
        f"{o.problems}\n{o.detail}" for o in failed)


# The loop's thread tells the callers it ended, then returns: a delay between the two must
# not let shutdown(wait=True) return with the thread still there. (CI's soak saw two
# threads after a shutdown once, on a loaded machine.)
SHUTDOWN_WITH_THE_LOOP_THREAD_SLOW_TO_RETURN = '''
import os, threading
os.environ["POOL_SHAKE"] = "at=loop.after_end:1"
import pool
if __name__ == "__main__":
    with pool.ProcessPool(1) as p:
        p.submit(abs, -1).result()
        thread = p._dispatcher.thread
    print(thread.is_alive(), threading.active_count())
'''


def test_shutdown_returns_once_the_loops_thread_is_gone(tmp_path):
    code, out, err = run_to_the_end(SHUTDOWN_WITH_THE_LOOP_THREAD_SLOW_TO_RETURN, tmp_path)
    assert (code, out) == (0, "False 1\n"), err

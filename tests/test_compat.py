"""``pool._compat``: every private name of the stdlib that pool relies on is there on the
running Python, and each accessor does what its docstring says.

A new Python that renames one fails here first, by name, rather than somewhere deep in a
pool's life. (``tests/test_imports.py`` holds that no other module reaches such names.)
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import threading
from concurrent.futures import Future

from helpers import run_script
from pool import _compat


def test_every_private_name_is_there():
    # The accessors that tolerate a missing name (a Python without it) are checked here,
    # so that such a Python is noticed.
    import atexit
    import concurrent.futures._base as base
    from multiprocessing import forkserver, process, util
    assert callable(getattr(threading, "_register_atexit", None))
    assert callable(getattr(atexit, "_run_exitfuncs", None))
    assert callable(getattr(sys, "_getframe", None))
    assert callable(getattr(util, "_flush_std_streams", None))
    assert isinstance(getattr(process, "_children", None), set)
    assert all(hasattr(base, name) for name in (
        "PENDING", "RUNNING", "CANCELLED", "CANCELLED_AND_NOTIFIED", "FINISHED", "LOGGER",
        "_STATE_TO_DESCRIPTION_MAP"))
    server = forkserver._forkserver
    for name in ("_forkserver_pid", "_preload_modules", "_forkserver_alive_fd"):
        assert hasattr(server, name), name
    # What pipes_of_failed_fork reads: _launch's locals, by name.
    import inspect
    from multiprocessing import popen_fork, spawn
    launch = inspect.getsource(popen_fork.Popen._launch)
    for name in ("parent_r", "child_w", "child_r", "parent_w"):
        assert name in launch, name
    assert "_inheriting = True" in inspect.getsource(spawn)  # starting_as_spawned_worker
    from concurrent.futures import process as futures_process
    assert issubclass(futures_process._RemoteTraceback, Exception)  # death_cause


def test_starting_as_spawned_worker_is_true_only_while_a_worker_imports_the_main(tmp_path):
    script = tmp_path / "main_script.py"
    script.write_text(
        "import multiprocessing, sys\n"
        f"sys.path.insert(0, {str(pathlib.Path(_compat.__file__).parent.parent)!r})\n"
        "from pool import _compat\n"
        "SEEN_AT_IMPORT = _compat.starting_as_spawned_worker()\n"
        "def at_import(_):\n"
        "    return SEEN_AT_IMPORT\n"
        "def in_task(_):\n"
        "    return _compat.starting_as_spawned_worker()\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.get_context('spawn').Pool(1) as p:\n"
        "        print(_compat.starting_as_spawned_worker(), p.map(at_import, [0])[0],\n"
        "              p.map(in_task, [0])[0])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, check=True, cwd=str(tmp_path)).stdout
    assert out.split() == ["False", "True", "False"]


def test_pipes_of_failed_fork_finds_the_launch_pipes_only_when_fork_raised():
    # A stand-in for popen_fork's frame: the finder reads a frame's code name, file name and
    # locals, so a function of that name in a file of that name is the same to it.
    import tempfile
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "popen_fork.py")
    with open(path, "w") as out:
        out.write("def _launch(self, fds, failing):\n"
                  "    parent_r, child_w, child_r, parent_w = fds\n"
                  "    if failing:\n"
                  "        raise OSError(11, 'fork refused')\n")
    namespace: dict = {}
    exec(compile(open(path).read(), path, "exec"), namespace)

    class Popen:
        pid = None

    try:
        namespace["_launch"](Popen(), (10, 11, 12, 13), True)
    except OSError as exc:
        assert _compat.pipes_of_failed_fork(exc) == [10, 11, 12, 13]
    Popen.pid = 123  # forked: the pipes were handed on, and are not the pool's to close
    try:
        namespace["_launch"](Popen(), (10, 11, 12, 13), True)
    except OSError as exc:
        assert _compat.pipes_of_failed_fork(exc) == []
    assert _compat.pipes_of_failed_fork(ValueError("no traceback")) == []
    os.remove(path)
    os.rmdir(folder)


def test_importing_it_imports_nothing_a_worker_does_not_need():
    heavy = ("concurrent.futures", "logging", "inspect", "atexit", "multiprocessing.util",
             "multiprocessing.forkserver", "asyncio")
    code = ("import sys; import pool._compat; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]", out


def test_rlock_is_the_c_type_threading_makes():
    assert type(threading.RLock()) is _compat.RLock
    lock = _compat.RLock()
    with lock, lock:  # re-entrant
        pass


def test_calling_frame_is_the_callers():
    def caller():
        return _compat.calling_frame()
    frame = caller()
    assert frame.f_code is caller.__code__
    assert frame.f_back is not None and frame.f_back.f_code is (
        test_calling_frame_is_the_callers.__code__)


def test_future_states_and_their_words_are_futures():
    states = _compat.future_states()
    future: Future[int] = Future()
    assert future._state == states.pending
    assert repr(future).find(f"state={_compat.future_state_description(states.pending)}") > 0
    assert future.set_running_or_notify_cancel() and future._state == states.running
    future.set_result(1)
    assert future._state == states.finished
    assert _compat.future_state_description(states.finished) == "finished"
    assert len(set(states)) == 5
    assert _compat.futures_logger() is logging.getLogger("concurrent.futures")


def test_done_future_cancelled_reads_the_state():
    finished: Future[int] = Future()
    finished.set_result(1)
    cancelled: Future[int] = Future()
    cancelled.cancel()
    notified: Future[int] = Future()
    notified.cancel()
    notified.set_running_or_notify_cancel()
    assert not _compat.done_future_cancelled(finished)
    assert _compat.done_future_cancelled(cancelled)
    assert _compat.done_future_cancelled(notified)


def test_forkserver_pid_and_preload_are_the_running_servers():
    # The session started the forkserver (conftest): its pid is a live process of ours.
    pid = _compat.forkserver_pid()
    assert isinstance(pid, int)
    os.kill(pid, 0)
    preload = _compat.forkserver_preload()
    assert preload and all(isinstance(name, str) for name in preload)
    preload.append("not.the.servers")
    assert "not.the.servers" not in _compat.forkserver_preload()  # a copy


def test_the_threading_hook_runs_before_threads_are_joined(tmp_path):
    _, proc = run_script('''
        from pool import _compat
        release = threading.Event()
        waiter = threading.Thread(target=release.wait, name="waiter")  # not a daemon
        waiter.start()

        def at_exit():
            print("waiter alive:", waiter.is_alive(), flush=True)
            release.set()

        _compat.register_before_threads_joined(at_exit)
    ''', "spawn", tmp_path, timeout=30)
    # Had the interpreter joined the thread first, it would have waited for ever.
    assert proc.stdout.strip() == "waiter alive: True", proc.stdout


def test_atexit_functions_run_when_asked(tmp_path):
    _, proc = run_script('''
        import atexit
        from pool import _compat
        atexit.register(print, "at exit", flush=True)
        _compat.run_atexit_functions()
        print("after", flush=True)
    ''', "spawn", tmp_path, timeout=30)
    assert proc.stdout.startswith("at exit\nafter\n"), proc.stdout


def test_forgotten_forkserver_and_child_process_and_closed_popen(tmp_path):
    facts, _ = run_script('''
        from pool import _compat
        _compat.forget_inherited_forkserver()  # never imported here: nothing to do
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", "json"])
        first = ctx.Process(target=time.sleep, args=(0,))
        first.start()
        first.join()
        server = _compat.forkserver_pid()
        sentinel = first.sentinel
        _compat.close_process_popen(first)
        try:
            os.fstat(sentinel)
            closed = False
        except OSError:
            closed = True
        pid = os.fork()
        if pid == 0:  # the child: a forkserver of its own, with the same preload
            _compat.forget_inherited_forkserver()
            ok = _compat.forkserver_pid() is None and (
                _compat.forkserver_preload() == ["__main__", "json"])
            second = ctx.Process(target=time.sleep, args=(0,))
            second.start()
            second.join()
            ok = ok and second.exitcode == 0 and _compat.forkserver_pid() not in (None, server)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        stuck = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
        stuck.start()
        listed = stuck in multiprocessing.active_children()
        _compat.forget_child_process(stuck)
        forgotten = stuck not in multiprocessing.active_children()
        stuck.kill()
        stuck.join()
        report(server=server, closed=closed, exitcode=first.exitcode,
               child=os.waitstatus_to_exitcode(status), listed=listed, forgotten=forgotten)
    ''', "spawn", tmp_path, timeout=60)
    assert isinstance(facts["server"], int)
    assert facts["closed"] and facts["exitcode"] == 0
    assert facts["child"] == 0
    assert facts["listed"] and facts["forgotten"]


def test_worker_starts_leave_std_streams_unflushed_on_their_thread_only(tmp_path):
    facts, _ = run_script('''
        from multiprocessing import util
        from pool import _compat
        original = util._flush_std_streams
        flushes = []

        class Recorder:
            def write(self, text):
                return len(text)
            def flush(self):
                flushes.append(threading.current_thread().name)

        ctx = multiprocessing.get_context("fork")
        def start():
            process = ctx.Process(target=os._exit, args=(0,))
            process.start()
            process.join()
        untouched = util._flush_std_streams is original  # nothing is installed by import
        saved, sys.stdout = sys.stdout, Recorder()
        try:
            with _compat.std_streams_left_unflushed():
                start()                                      # skipped
            inside = list(flushes)
            with _compat.std_streams_left_unflushed():
                other = threading.Thread(target=start, name="other")
                other.start()                                # another thread: flushed
                other.join()
            start()                                          # outside: flushed
        finally:
            sys.stdout = saved
        report(untouched=untouched, inside=inside, after=flushes)
    ''', "spawn", tmp_path, timeout=60)
    assert facts["untouched"]
    assert facts["inside"] == []
    assert facts["after"] == ["other", "MainThread"]


def test_each_private_name_says_why_and_where_it_was_checked():
    # One "Checked on" per entry: in the docstring of each accessor, in the comment above
    # a constant or above what an accessor shares (the flush filter).
    accessors = [name for name, value in vars(_compat).items()
                 if callable(value) and getattr(value, "__module__", None) == _compat.__name__
                 and not name.startswith("_") and not isinstance(value, type)]
    assert len(accessors) >= 13, accessors
    for name in accessors:
        doc = getattr(_compat, name).__doc__ or ""
        assert doc, f"{name} says nothing"
        if name != "std_streams_left_unflushed":
            assert "Checked on 3.11, 3.12, 3.13, 3.14, 3.15" in doc, name
    source = open(_compat.__file__).read()
    assert source.count("# Checked on 3.11, 3.12, 3.13, 3.14, 3.15") == 2  # RLock, the filter

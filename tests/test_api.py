"""The public surface: what ``pool`` exports, and the README's promises about commands."""

from __future__ import annotations

import pickle
import re
from concurrent.futures.process import BrokenProcessPool

import pool
from helpers import REPO_DIR

PUBLIC = ["ProcessPool", "ProcessPoolExecutor", "Pool", "AsyncResult", "MapResult",
          "IMapIterator", "PoolFuture", "PoolStats", "WorkerStats",
          "as_completed", "as_completed_async", "to_process", "shared", "Lease", "patch", "Patch",
          "SharedPoolConflict", "WorkerDied", "TaskTimeout",
          "WorkerTerminated", "InitializerError", "WorkerStartRefused",
          "PoolInternalError", "WorkerProtocolError", "RemoteTaskError", "ResultTransferError",
          "ArgumentPicklingError", "ArgumentUnpicklingError", "TaskInfo", "__version__"]


def test_the_tests_exercise_the_installed_package():
    # Under tox, pool must come from the wheel in site-packages, not the source tree.
    import os
    if os.environ.get("TOX_ENV_NAME"):
        assert "site-packages" in pool.__file__


def test_all_is_pinned():
    assert sorted(pool.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(pool, name).__doc__, f"{name} has no docstring"


def test_a_worker_imports_only_what_a_worker_runs():
    # Every worker imports this package (its main is pool._worker.main): the executor, the
    # dispatcher, the state machine and asyncio load only where they are used, so that a
    # worker's start under spawn and forkserver does not pay for them.
    import subprocess
    import sys
    # A worker also imports the user's main script again, and with it pool.ProcessPool.
    heavy = ("'pool._dispatcher', 'pool._core', "
             "'pool._core.machine', 'pool._core.actions', 'pool._mapping', 'pool._shared', "
             "'pool._aio', 'asyncio'")
    for imports in ("import pool._worker.main",
                    "import pool._worker.main; from pool import ProcessPool"):
        code = f"import sys; {imports}; print(sorted(m for m in ({heavy}) if m in sys.modules))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        assert out.strip() == "[]", (imports, out)
    # A worker alone (a main that does not import the executor) loads neither cloudpickle
    # nor tblib, logging or the pool's errors (and concurrent.futures.process, their base)
    # until a task needs them: a function pickled by value, an exception, an error.
    lean = ("'cloudpickle', 'tblib', 'logging', 'pool._errors', 'concurrent.futures.process'")
    code = f"import sys, pool._worker.main; print(sorted(m for m in ({lean}) if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]", out


def test_importing_to_process_loads_no_pool():
    # A main script that imports to_process is imported again by every spawn and forkserver
    # worker: the shared pool, the executor and the errors load at the first call only.
    import subprocess
    import sys
    heavy = "'pool._shared', 'pool._executor', 'pool._errors', 'pool._dispatcher.front'"
    code = (f"import sys; from pool import to_process; "
            f"print(sorted(m for m in ({heavy}) if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]", out


def test_every_public_name_loads_on_first_use_and_is_listed():
    import subprocess
    import sys
    code = ("import pool; names = dir(pool); "
            "assert all(n in names for n in pool.__all__), names; "
            "from pool import *; "
            "assert all(n in globals() for n in pool.__all__); "
            "import pool._executor; assert pool.ProcessPool is pool._executor.ProcessPool")
    subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
    # A private module is no attribute of the package until something imports it.
    code = ("import pool\ntry: pool._executor\nexcept AttributeError: pass\n"
            "else: raise SystemExit('pool._executor resolved')")
    subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
    for unknown in ("NoSuchThing", "_no_such_module"):
        try:
            getattr(pool, unknown)
        except AttributeError as exc:
            assert unknown in str(exc)
        else:
            raise AssertionError(f"{unknown} resolved")


def test_version_is_the_installed_distributions():
    from importlib import metadata
    assert pool.__version__ == metadata.version("sturdypool")


def test_public_classes_show_and_pickle_as_pool_names():
    import typing
    for name in PUBLIC:
        obj = getattr(pool, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert obj.__module__ == "pool", name
        if isinstance(obj, type):
            assert pickle.loads(pickle.dumps(obj)) is obj
            typing.get_type_hints(obj)  # introspection still resolves their annotations
    assert pool.ProcessPoolExecutor is pool.ProcessPool
    info = pool.TaskInfo(1, len, (), {})
    text = "".join(__import__("traceback").format_exception(pool.WorkerDied(1, -9, info)))
    assert text.splitlines()[-2].startswith("pool.WorkerDied: worker pid 1 died")


def test_repr_shows_workers_queued_and_sent_tasks(tmp_path):
    import tasks
    gate = tmp_path / "gate"
    p = pool.ProcessPool(1)
    assert repr(p) == "<pool.ProcessPool running: 0 of 1 workers (forkserver), 0 queued, 0 sent to workers>"
    running = p.submit(tasks.wait_for_file, str(gate), "done")
    large = b"x" * (1 << 20)  # too large to be sent ahead: stays in the pool's queue
    queued = p.submit(tasks.identity, large)
    while not running.running():
        running.exception(timeout=0.01) if running.done() else __import__("time").sleep(0.01)
    deadline = __import__("time").monotonic() + 30
    while "1 of 1 workers (forkserver), 1 queued, 1 sent" not in repr(p):
        assert __import__("time").monotonic() < deadline, repr(p)
        __import__("time").sleep(0.01)
    gate.touch()
    assert queued.result(timeout=30) == large
    p.shutdown()
    assert repr(p).startswith("<pool.ProcessPool shut down: 0 of 1 workers")


def test_pool_errors_are_caught_by_stdlib_handlers():
    for error in (pool.WorkerDied, pool.InitializerError, pool.WorkerStartRefused,
                  pool.PoolInternalError,
                  pool.WorkerProtocolError, pool.WorkerTerminated, pool.ResultTransferError,
                  pool.RemoteTaskError, pool.ArgumentUnpicklingError):
        assert issubclass(error, BrokenProcessPool)
    assert issubclass(pool.TaskTimeout, TimeoutError)
    assert issubclass(pool.ArgumentPicklingError, pickle.PicklingError)


def test_errors_pickle_with_their_message():
    info = pool.TaskInfo(7, len, ([1, 2, 3],), {"key": "v" * 200})
    errors = [pool.WorkerDied(123, -11, info, "Fatal Python error: Segmentation fault"),
              pool.InitializerError("failed", "Traceback ..."),
              pool.WorkerStartRefused("no worker could run this task: ..."),
              pool.RemoteTaskError("mod.E", "msg", "Traceback ...", "why"),
              pool.ResultTransferError("Thing", "unpickling in the parent", "TypeError: x"),
              pool.ArgumentUnpicklingError("the worker could not unpickle ..."),
              pool.TaskTimeout(2.5, 123, info, "Current thread 0x1 (most recent call first):"),
              pool.WorkerTerminated(123, -15, info),
              pool.SharedPoolConflict({"max_workers": ("2", "3")}, 1)]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)


def test_worker_died_message_names_everything():
    info = pool.TaskInfo(7, len, ([1, 2, 3],), {"key": "v" * 200})
    text = str(pool.WorkerDied(123, -9, info))
    assert "pid 123" in text and "SIGKILL" in text and "task 7: builtins.len([1, 2, 3]" in text
    assert "..." in text  # long arguments are shortened
    assert pool.WorkerDied(5, 3, info).signal_name is None


def test_nested_arguments_are_shortened_as_a_whole():
    # (A dask scheduler hands each task a list of tuples of keys and pickled bytes.)
    batch = [(("from_sequence-inc-" + "f" * 40, n), b"\x80\x05" * 300, {"k": [n] * 9})
             for n in range(6)]
    text = pool.TaskInfo(1, len, (batch, batch), {"key": batch}).describe()
    assert len(text) < 3 * 100 + 40, text
    assert text.startswith("task 1: builtins.len([(('from_sequence-inc-")


def _readme_commands():
    text = (REPO_DIR / "README.rst").read_text()
    return re.findall(r"^    (python3 -m venv .*)$", text, re.M)


def test_readme_starts_with_the_demo_and_test_commands():
    demo, tests = _readme_commands()[:2]
    assert "-m pool demo" in demo
    assert "tox" in tests


def test_ci_runs_exactly_the_readme_test_command():
    ci = (REPO_DIR / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci.splitlines()

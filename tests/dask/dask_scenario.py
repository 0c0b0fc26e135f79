"""What every dask scenario script starts with: its tasks, defined in the script itself (so
they are functions of ``__main__``, as in a user's script: dask#6803), and a cluster.

test_dask.py writes this file's text, then a scenario's body under the ``__main__`` guard,
into one script, and runs it in a child interpreter in a session of its own.
"""

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

import dask
import psutil
from distributed import Client, LocalCluster

import pool
from pool.dask import ProcessPoolPlugin

START_METHOD = os.environ["POOL_TEST_START_METHOD"]
HERE = Path.cwd()


def gone(pid):
    """The process has exited (a zombie counts: only its parent's reaping is left). It may
    go between asking whether it exists and asking its state."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(path, timeout=30.0):
    """Block until ``path`` exists (tasks and the script meet through files, not sleeps)."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.01)


def say(name, text=""):
    """Write ``HERE/name`` atomically: whoever sees the file also sees its whole text (a
    reader that polls for a plain write can find it created and still empty)."""
    partial = HERE / (name + ".partial")
    partial.write_text(text)
    os.replace(partial, HERE / name)


def bystander(i, until="fault-done"):
    """Starts, says so, runs until the file ``until`` appears (by default: once the fault
    has happened), and succeeds."""
    say(f"bystander-{i}", str(os.getpid()))
    wait_for(HERE / until)
    return ("bystander", i, os.getpid())


def together(i, n):
    """Runs until ``n`` of these run at once (so that ``n`` pool processes exist)."""
    say(f"together-{i}", str(os.getpid()))
    for j in range(n):
        wait_for(HERE / f"together-{j}")
    return os.getpid()


def fault(kind):
    """Waits until the bystanders run, then fails as ``kind`` says."""
    wait_for(HERE / "bystander-0")
    wait_for(HERE / "bystander-1")
    say("fault-pid", str(os.getpid()))
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "exit":
        os._exit(3)
    elif kind in ("sigkill", "timeout"):
        time.sleep(60)  # killed from outside, or stopped by the task timeout
    raise AssertionError(f"fault {kind} did not happen")


def where():
    return os.getpid()


def dies_on_first_try(marker):
    if not Path(marker).exists():
        Path(marker).write_text("tried")
        os.kill(os.getpid(), signal.SIGKILL)
    return "second try"


def descendants():
    """Every process this script started, however deep (nanny, dask worker, pool)."""
    return sorted(p.pid for p in psutil.Process().children(recursive=True))


def cluster(**options):
    options = {"n_workers": 1, "threads_per_worker": 3, "processes": True,
               "dashboard_address": None, **options}
    return LocalCluster(**options)


def report(**facts):
    print("REPORT " + json.dumps(facts), flush=True)


def error_of(future):
    try:
        return {"result": repr(future.result())}
    except Exception as exc:  # what reached the client
        return {"type": type(exc).__name__, "module": type(exc).__module__,
                "message": str(exc), "is_broken_pool": isinstance(
                    exc, __import__("concurrent.futures.process").futures.process.BrokenProcessPool)}

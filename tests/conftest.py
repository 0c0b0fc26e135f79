from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading

import pytest

from helpers import (START_METHODS, TESTS_DIR, children_of, helper_pids, new_threads,
                     open_fds, wait_until)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress-seconds", type=float, default=0.0,
                     help="run the random-kill stress test for this long per start method "
                          "(default: a short fixed batch)")


IN_CHILD = "POOL_TEST_IN_CHILD"

# A suite started in the background by a non-interactive shell (``tox run &`` in a script)
# inherits SIGINT ignored, and so would every child a test starts: a test that sends a
# child Ctrl-C would see it ignored, as pool rightly keeps an inherited SIG_IGN (nohup).
# With a handler here instead, children start with the default disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker else float(item.config.getini("timeout"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = config.getoption("--stress-seconds")
    if seconds:  # a long stress run was asked for: give it the time
        for item in items:
            if "stress" in item.keywords:
                item.add_marker(pytest.mark.timeout(seconds + 300))
    if not os.environ.get(IN_CHILD):
        for item in items:  # the child keeps the limit; its parent waits a little longer
            if item.get_closest_marker("isolated"):
                item.add_marker(pytest.mark.timeout(_timeout_of(item) + 60))


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``isolated`` test in a child interpreter (a fresh pytest, that one test)."""
    if os.environ.get(IN_CHILD) or not pyfuncitem.get_closest_marker("isolated"):
        return None
    config = pyfuncitem.config
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--stress-seconds={config.getoption('--stress-seconds')}",
            f"{pyfuncitem.path}::{pyfuncitem.name}"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, cwd=str(TESTS_DIR),
                              env=dict(os.environ, **{IN_CHILD: "1"}),
                              timeout=_timeout_of(pyfuncitem) - 30)
    except subprocess.TimeoutExpired as exc:  # say what the child was doing, in full
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else ""
        errors = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"a child interpreter that did not end in {exc.timeout} s:\n"
                    f"{output[-12000:]}\n{errors[-4000:]}", pytrace=False)
    sys.stdout.write(proc.stdout[-4000:])
    if proc.returncode != 0 or " passed" not in proc.stdout:
        pytest.fail(f"in a child interpreter (exit {proc.returncode}):\n{proc.stdout[-8000:]}"
                    f"\n{proc.stderr[-4000:]}", pytrace=False)
    return True


@pytest.fixture(scope="session", autouse=True)
def _start_multiprocessing_helpers() -> None:
    # The forkserver and the resource tracker live for the whole session once started;
    # start them first so that the leak check does not count them.
    from multiprocessing import forkserver, resource_tracker
    forkserver.ensure_running()
    resource_tracker.ensure_running()
    # The first import of ctypes (tests/tasks.py has it) makes a callback, for which some
    # builds of libffi open a descriptor they keep for good: open it before any snapshot.
    __import__("ctypes")


@pytest.fixture(autouse=True)
def no_leaks() -> object:
    """Fails a test that leaves child processes, threads or descriptors behind."""
    fds = open_fds()
    threads = set(threading.enumerate())
    children = children_of(os.getpid())
    yield
    for thread in new_threads(threads):
        thread.join(10)
    leaked_threads = [t.name for t in new_threads(threads)]
    assert not leaked_threads, f"threads left running: {leaked_threads}"
    ok = wait_until(lambda: children_of(os.getpid()) - helper_pids() <= children, 10)
    assert ok, f"child processes left: {children_of(os.getpid()) - children - helper_pids()}"
    assert wait_until(lambda: open_fds() <= fds, 5), f"descriptors left open: {_describe(open_fds() - fds)}"


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def ctx(start_method: str) -> object:
    return multiprocessing.get_context(start_method)


def _describe(fds: set[int]) -> list[str]:
    """What each leaked descriptor is (a pipe, a socket, a file), for the failure message."""
    described = []
    for fd in sorted(fds):
        try:
            described.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            described.append(f"{fd} (closed since)")
    return described

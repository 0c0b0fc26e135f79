from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from helpers import START_METHODS, children_of, helper_pids, new_threads, open_fds, wait_until


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress-seconds", type=float, default=0.0,
                     help="run the random-kill stress test for this long per start method "
                          "(default: a short fixed batch)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = config.getoption("--stress-seconds")
    if seconds:  # a long stress run was asked for: give it the time
        for item in items:
            if "stress" in item.keywords:
                item.add_marker(pytest.mark.timeout(seconds + 300))


@pytest.fixture(scope="session", autouse=True)
def _start_multiprocessing_helpers() -> None:
    # The forkserver and the resource tracker live for the whole session once started;
    # start them first so that the leak check does not count them.
    from multiprocessing import forkserver, resource_tracker
    forkserver.ensure_running()
    resource_tracker.ensure_running()


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
    assert wait_until(lambda: open_fds() <= fds, 5), f"descriptors left open: {open_fds() - fds}"


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def ctx(start_method: str) -> object:
    return multiprocessing.get_context(start_method)

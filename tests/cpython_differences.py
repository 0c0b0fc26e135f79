"""Where ``pool`` is expected to differ from what CPython's ``test.test_concurrent_futures``
checks (see tests/test_cpython_suite.py, which runs that suite against ``pool``).

One table, ``DIFFERENCES``, keyed by the test's name without its start method:
``"<Class>.<test method>"`` where ``<Class>`` is the test class with its
``ProcessPool<Fork|Forkserver|Spawn>`` prefix removed (``ProcessPoolExecutorTest``,
``ProcessPoolShutdownTest``, ``WaitTest``, ``AsCompletedTest``, ``ExecutorDeadlockTest``,
``InitializerTest``, ``FailingInitializerTest``, ``FailingInitializerResourcesTest``), or a
bare ``"<test method>"`` for that method in any class. A run that ends between tests is
named after the fixture that hung, e.g. ``"tearDownModule (test_shutdown)"``, and an
interpreter exit that had to be cut short ``"(interpreter exit)"``.

Each value is one ``Difference`` (or a tuple of them, for different start methods or
Pythons): the outcomes allowed (default: ``failed`` or ``error``), the start methods and
Python versions it applies to (default: all), and the reason in one line. A reason that
is a guess starts with ``TODO``.

The test fails on any failure, error or hang that is not listed here, and on a listed one
that now passes: remove its entry then. Entries are a debt list: each is either one of
the deliberate differences in README.rst (name it) or a bug to fix.
"""

from __future__ import annotations

from dataclasses import dataclass

START_METHODS = frozenset({"fork", "forkserver", "spawn"})
FAILS = frozenset({"failed", "error"})
HANGS = frozenset({"hang"})


@dataclass(frozen=True)
class Difference:
    reason: str
    outcomes: frozenset[str] = FAILS
    start_methods: frozenset[str] = START_METHODS
    pythons: frozenset[str] | None = None  # "3.13", "3.14"; None: every version

    def applies(self, start_method: str, python: str) -> bool:
        return (start_method in self.start_methods
                and (self.pythons is None or python in self.pythons))


def fails(reason: str, *, methods: tuple[str, ...] = (), pythons: tuple[str, ...] = (),
          outcomes: frozenset[str] = FAILS) -> Difference:
    return Difference(reason, outcomes, frozenset(methods) or START_METHODS,
                      frozenset(pythons) or None)


def hangs(reason: str, *, methods: tuple[str, ...] = (),
          pythons: tuple[str, ...] = ()) -> Difference:
    return fails(reason, methods=methods, pythons=pythons, outcomes=HANGS)


DIFFERENCES: dict[str, Difference | tuple[Difference, ...]] = {
    # -- deliberate differences (README.rst, "Differences from ProcessPoolExecutor") ----------
    "ProcessPoolExecutorTest.test_killed_child":
        fails("README 1: a killed worker fails only its task, the pool is not broken"),
    "ProcessPoolExecutorTest.test_max_tasks_per_child":
        fails("README 2: max_tasks_per_child works with fork (no ValueError)",
              methods=("fork",)),
    "ProcessPoolExecutorTest.test_max_tasks_per_child_defaults_to_spawn_context":
        fails("README 2: max_tasks_per_child does not switch the default context to spawn"),
    "ProcessPoolExecutorTest.test_traceback":
        fails("README 6: the real remote traceback (tblib), not a _RemoteTraceback cause"),

    # -- to fix or to explain (observed; the reasons marked TODO are guesses) -------------------
    "ProcessPoolExecutorTest.test_saturation":
        fails("TODO: executor._processes does not list the started workers"),
    "ProcessPoolExecutorTest.test_python_finalization_error":
        fails("TODO: mocks threading._start_joinable_thread; pool starts no thread then,"
              " so map() runs and mul() gets one tuple", methods=("forkserver", "spawn")),
    "ProcessPoolShutdownTest.test_cancel_futures":
        fails("TODO: shutdown(cancel_futures=True) cancelled none of 50 queued tasks"),
    "ProcessPoolShutdownTest.test_processes_terminate":
        fails("TODO: executor._processes does not list the started workers"),
    "ProcessPoolShutdownTest.test_del_shutdown":
        fails("TODO: no executor._call_queue / _executor_manager_thread"),
    "ProcessPoolShutdownTest.test_shutdown_no_wait":
        fails("TODO: no executor._call_queue / _executor_manager_thread"),
    "FailingInitializerTest.test_initializer":
        fails("TODO: initargs holding a multiprocessing Queue cannot be pickled in the"
              " constructor (README 3 pickles initargs there)"),
}


def lookup(key: str, start_method: str, python: str) -> Difference | None:
    """The difference listed for test ``key`` under this start method and Python, if any
    (an entry for ``Class.method`` wins over one for the bare method)."""
    for name in (key, key.rpartition(".")[2]):
        entry = DIFFERENCES.get(name)
        for difference in entry if isinstance(entry, tuple) else (entry,) if entry else ():
            if difference.applies(start_method, python):
                return difference
    return None


def listed(start_method: str, python: str) -> set[str]:
    """Every key with an entry that applies to this start method and Python."""
    return {key for key, entry in DIFFERENCES.items()
            if any(d.applies(start_method, python)
                   for d in (entry if isinstance(entry, tuple) else (entry,)))}

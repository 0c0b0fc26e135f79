"""Where ``pool`` is expected to differ from what CPython's ``test.test_concurrent_futures``
checks (see tests/test_cpython_suite.py, which runs that suite against ``pool``).

One table, ``DIFFERENCES``, keyed by the test's name without its start method:
``"<Class>.<test method>"`` where ``<Class>`` is the test class with its
``ProcessPool<Fork|Forkserver|Spawn>`` prefix removed (``ProcessPoolExecutorTest``,
``ProcessPoolShutdownTest``, ``WaitTest``, ``AsCompletedTest``, ``ExecutorDeadlockTest``,
``InitializerTest``, ``FailingInitializerTest``, ``FailingInitializerResourcesTest``), or a
bare ``"<test method>"`` for that method in any class. A run that ends between tests is
named after the fixture that hung, e.g. ``"tearDownModule (test_shutdown)"``, and an
interpreter exit that had to be cut short ``"(interpreter exit)"``. A test listed as a
hang still runs, with a shorter time limit (so that a fix shows).

Each value is one ``Difference`` (or a tuple of them, for different start methods or
Pythons): the outcomes allowed (``fails``: failed or error; ``hangs``; ``flaky``: failed,
error or passed), the start methods and Python versions it applies to (default: all), and
the reason in one line, naming the deliberate difference in docs/differences.rst ("README
N" is its number there; the list was README's) it comes from. A failure that no listed
difference explains is a bug to fix, not an entry to add.

The test fails on any failure, error or hang that is not listed here, and on a listed one
that now passes: remove its entry then.
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
    pythons: frozenset[str] | None = None  # "3.13", "3.14", "3.15"; None: every version

    def applies(self, start_method: str, python: str) -> bool:
        return (start_method in self.start_methods
                and (self.pythons is None or python in self.pythons))


def fails(reason: str, *, methods: tuple[str, ...] = (), pythons: tuple[str, ...] = (),
          outcomes: frozenset[str] = FAILS) -> Difference:
    return Difference(reason, outcomes, frozenset(methods) or START_METHODS,
                      frozenset(pythons) or None)


def flaky(reason: str, *, methods: tuple[str, ...] = (),
          pythons: tuple[str, ...] = ()) -> Difference:
    """Fails only some of the time: either outcome is accepted (so it never asks to be
    removed; remove it once the cause is fixed)."""
    return fails(reason, methods=methods, pythons=pythons, outcomes=FAILS | {"passed"})


def hangs(reason: str, *, methods: tuple[str, ...] = (),
          pythons: tuple[str, ...] = ()) -> Difference:
    return fails(reason, methods=methods, pythons=pythons, outcomes=HANGS)


SPAWNING = ("forkserver", "spawn")  # the start methods where 3.14's max_tasks tests run

DIFFERENCES: dict[str, Difference | tuple[Difference, ...]] = {
    # README 1: a worker's death fails only its own task; the pool is not broken.
    "ProcessPoolExecutorTest.test_killed_child":
        fails("README 1: the killed worker's task fails (WorkerDied, a BrokenProcessPool) but"
              " the pool is not broken, so the next submit() works"),
    "ProcessPoolExecutorTest.test_broken_process_pool_traceback":
        hangs("README 1: only the killed worker's task fails; the other two wait for an event"
              " the test never sets, as they would on a pool that is not broken",
              pythons=("3.14", "3.15")),
    # README 2: max_tasks_per_child.
    "ProcessPoolExecutorTest.test_max_tasks_per_child":
        fails("README 2: max_tasks_per_child works with fork (no ValueError)",
              methods=("fork",)),
    "ProcessPoolExecutorTest.test_max_tasks_per_child_defaults_to_spawn_context":
        fails("README 2: max_tasks_per_child does not switch the default context to spawn"),
    # README 4: a call that cannot be pickled fails its future in submit(), starting nothing.
    "ProcessPoolExecutorTest.test_saturation":
        fails("README 4: submit(sem.acquire) cannot be pickled (a SemLock outside a process"
              " start), so its future fails at once and no worker is started for it"),
    "ProcessPoolShutdownTest.test_processes_terminate":
        fails("README 4 and 13: the Semaphore argument cannot be pickled, so no worker starts"
              " for those calls (and fork does not start every worker at once)"),
    # README 6: real remote frames.
    "ProcessPoolExecutorTest.test_traceback":
        fails("README 6: the real remote traceback (tblib), no _RemoteTraceback __cause__"),
    # README 13: workers start on demand, on the pool's thread.
    "ProcessPoolShutdownTest.test_cancel_futures":
        flaky("README 13: cancel_futures cancels every task no worker has begun; just after the"
              " submits the workers are still starting, so usually all 50 are cancelled"),
    # README 14: a dropped pool finishes what was submitted.
    "ProcessPoolExecutorTest.test_gc_during_max_tasks_worker_exit_gh152967":
        fails("README 14: a garbage-collected pool still runs the tasks already submitted (3.14"
              " fails them, 'garbage collected')", methods=SPAWNING, pythons=("3.14", "3.15")),
    "ProcessPoolExecutorTest.test_shutdown_no_wait_max_tasks_gh119592":
        fails("README 14: a garbage-collected pool still runs the tasks already submitted (3.14"
              " fails them, 'garbage collected')", methods=SPAWNING, pythons=("3.14", "3.15")),
    # README 15: the stdlib's internals, which these tests reach into, do not exist.
    "ProcessPoolShutdownTest.test_del_shutdown":
        fails("README 15: no executor._call_queue"),
    "ProcessPoolShutdownTest.test_shutdown_no_wait":
        fails("README 15: no executor._call_queue"),
    "tearDownModule (test_shutdown)":
        hangs("README 15: the pools that test_del_shutdown / test_shutdown_no_wait leave (they"
              " fail on _call_queue before dropping them; the failure's traceback keeps them)"
              " still hold the resource tracker's pipe when multiprocessing.util._cleanup_tests"
              " waits for it", methods=SPAWNING, pythons=("3.13",)),
    "ProcessPoolExecutorTest.test_python_finalization_error":
        fails("README 15: the test makes the second thread a pool starts fail (the stdlib's"
              " queue feeder); pool needs only its dispatcher, so map() runs and mul() gets one"
              " tuple", methods=SPAWNING),
    "ProcessPoolExecutorTest.test_terminate_workers":
        fails("README 15: mocks executor._force_shutdown(operation=_TERMINATE)",
              pythons=("3.14", "3.15")),
    "ProcessPoolExecutorTest.test_kill_workers":
        fails("README 15: mocks executor._force_shutdown(operation=_KILL)", pythons=("3.14", "3.15")),
    "ProcessPoolExecutorTest.test_force_shutdown_workers_invalid_op":
        fails("README 15: calls executor._force_shutdown", pythons=("3.14", "3.15")),
    "ProcessPoolExecutorTest.test_force_shutdown_workers":
        fails("README 15: expects terminate()/kill() on the Process objects (mocked); pool"
              " signals each worker's process group itself", pythons=("3.14", "3.15")),
    "ProcessPoolExecutorTest.test_force_shutdown_during_max_tasks_worker_exit":
        fails("README 15: sets executor._force_shutting_down under executor._shutdown_lock",
              methods=SPAWNING, pythons=("3.14", "3.15")),
    "ProcessPoolExecutorTest.test_failed_worker_replacement_breaks_pool":
        fails("README 15 and 3: patches concurrent.futures.process._spawn_worker, which pool"
              " does not use (its own start failures: InitializerError after 3 tries)",
              methods=SPAWNING, pythons=("3.14", "3.15")),
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


def listed(start_method: str, python: str, outcome: str | None = None) -> set[str]:
    """Every key with an entry that applies to this start method and Python (and allows
    ``outcome``, if given)."""
    return {key for key, entry in DIFFERENCES.items()
            if any(d.applies(start_method, python) and (outcome is None or outcome in d.outcomes)
                   for d in (entry if isinstance(entry, tuple) else (entry,)))}

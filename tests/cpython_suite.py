"""Run CPython's own ``test.test_concurrent_futures`` process-pool tests against ``pool``.

Usage (one start method per run)::

    python tests/cpython_suite.py --start-method fork --results results.jsonl \
        [--modules test_process_pool,test_shutdown] [--skip TEST_ID ...] [-k SUBSTRING]
    python tests/cpython_suite.py --remove-hook     # delete the .pth file described below

What it does:

- imports ``pool`` as this interpreter finds it (under tox, the installed wheel: this
  script's directory, ``tests/``, holds no ``pool``, so the source tree is used only if
  ``PYTHONPATH`` names it) and sets ``concurrent.futures.ProcessPoolExecutor`` (and
  ``concurrent.futures.ProcessPool``) to ``pool.ProcessPool`` *before* importing the test
  modules, whose mixins capture ``futures.ProcessPoolExecutor`` when their classes are
  defined;
- makes child interpreters do the same: some tests run code in ``python -I -c ...`` (which
  ignores ``PYTHONPATH``) doing ``from concurrent.futures import ProcessPool``. A one-line
  ``.pth`` file (``HOOK_FILE``) in this interpreter's site-packages does the substitution
  there, only when ``HOOK_VARIABLE`` is set in the environment (it holds the directory
  the tested ``pool`` was imported from, which the child puts on ``sys.path`` if it is
  not there); unset, the line does nothing (it imports only ``os``, which site already
  has). The file stays installed (harmless); the hook is checked in a child interpreter
  before any test runs, and a run that cannot install it fails rather than test the stdlib;
- keeps only the process-pool test classes for the chosen start method, runs them with
  ``unittest`` and appends one JSON line per event to the results file: ``run`` (a
  header listing the tests), ``started`` before each test, ``outcome`` after it (passed /
  failed / error / skipped, with the short traceback), ``finished`` at the end, so that a
  run killed by a hang says which test hung; ``fatal`` if it could not start;
- bounds every test, and what runs between tests (module fixtures and cleanups), with
  ``faulthandler.dump_traceback_later(..., exit=True)`` (see ``Watchdog``): a hang prints
  every thread's stack to stderr and ends the process with exit status 1. The
  interpreter's own exit (where a pool a test leaked would be waited for) is bounded the
  same way;
- with ``--lifeline FD``, kills its process group and exits when that pipe reports
  end-of-file (the caller died).

The caller (``tests/test_cpython_suite.py``) starts this in a session of its own, restarts
it after a hang with ``--skip-file`` listing what already ran, and kills the whole session
at the end, so that nothing a test leaked outlives the run.
"""

from __future__ import annotations

import _thread
import argparse
import faulthandler
import importlib
import json
import os
import site
import subprocess
import sys
import threading
import time
import traceback
import unittest
from typing import Any, Iterator

SUITE_PACKAGE = "test.test_concurrent_futures"
MODULES = ("test_process_pool", "test_shutdown", "test_wait", "test_as_completed",
           "test_deadlock", "test_init")
START_METHODS = ("fork", "forkserver", "spawn")

HOOK_VARIABLE = "POOL_CPYTHON_SUITE"
HOOK_FILE = "pool_cpython_suite_hook.pth"

# Run by the .pth line in every interpreter that starts with HOOK_VARIABLE set (the child
# interpreters of test_shutdown, and the processes they and the pool start): it makes
# ``concurrent.futures.ProcessPool`` and ``.ProcessPoolExecutor`` name ``pool.ProcessPool``,
# importing ``pool`` (from the directory the runner imported it from) only when one of
# those names is first looked up.
HOOK_SOURCE = f'''
def install():
    import os, sys
    import concurrent.futures as futures
    pool_dir = os.environ["{HOOK_VARIABLE}"]
    original = getattr(futures, "__getattr__", None)

    def __getattr__(name):
        if name in ("ProcessPool", "ProcessPoolExecutor"):
            if pool_dir not in sys.path:
                sys.path.insert(0, pool_dir)
            import pool
            futures.ProcessPool = futures.ProcessPoolExecutor = pool.ProcessPool
            return pool.ProcessPool
        if original is None:
            raise AttributeError(f"module {{futures.__name__!r}} has no attribute {{name!r}}")
        return original(name)

    futures.__getattr__ = __getattr__

install()
'''


def hook_text() -> str:
    """The .pth file's one line (a line that starts with ``import`` is executed by site)."""
    return f"import os; os.environ.get({HOOK_VARIABLE!r}) and exec({HOOK_SOURCE!r}, {{}})\n"


def install_hook() -> str:
    """Writes ``HOOK_FILE`` into this interpreter's site-packages (replacing only an older
    version of itself); returns its path. Raises ``RuntimeError`` when no site-packages
    directory on ``sys.path`` is writable."""
    text = hook_text()
    tried = []
    for directory in site.getsitepackages():
        if directory not in sys.path or not os.path.isdir(directory):
            continue
        path = os.path.join(directory, HOOK_FILE)
        try:
            with open(path) as f:
                if f.read() == text:
                    return path
        except OSError:
            pass
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as f:
                f.write(text)
            os.replace(temporary, path)  # atomic: a concurrent run never reads half a file
            return path
        except OSError as exc:
            tried.append(f"{directory}: {exc}")
            try:
                os.unlink(temporary)
            except OSError:
                pass
    raise RuntimeError("cannot install the child-interpreter hook in any site-packages "
                       f"directory of {sys.executable}: {tried or site.getsitepackages()}")


def check_hook(pool_module: Any) -> None:
    """Proves in an isolated child interpreter (as the tests start them) that the hook
    substitutes exactly the ``pool`` this process tests."""
    code = ("import sys; from concurrent.futures import ProcessPool, ProcessPoolExecutor; "
            "pool = sys.modules['pool']; "
            "assert ProcessPool is ProcessPoolExecutor is pool.ProcessPool; "
            "print(pool.__file__)")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-I", "-c", code],
                          capture_output=True, text=True, timeout=60)
    found = os.path.abspath(proc.stdout.strip()) if proc.stdout.strip() else ""
    if proc.returncode != 0 or found != os.path.abspath(pool_module.__file__):
        raise RuntimeError(f"the child-interpreter hook does not work (exit {proc.returncode},"
                           f" pool {proc.stdout.strip()!r}, expected {pool_module.__file__!r})"
                           f":\n{proc.stderr}")


def substitute() -> Any:
    """Imports the tested ``pool`` and makes ``concurrent.futures`` hand it out, here and
    (through the environment and the hook) in child interpreters. Returns the module."""
    import concurrent.futures as futures

    import pool
    pool_dir = os.path.dirname(os.path.dirname(os.path.abspath(pool.__file__)))
    os.environ[HOOK_VARIABLE] = pool_dir
    futures.ProcessPoolExecutor = pool.ProcessPool  # type: ignore[misc, assignment]
    futures.ProcessPool = pool.ProcessPool  # type: ignore[attr-defined]
    install_hook()
    check_hook(pool)
    return pool


def generic_key(test_id: str, start_method: str) -> str:
    """A test's name without its start method: ``"<Class>.<method>"`` with the class's
    ``ProcessPool<Fork|Forkserver|Spawn>`` prefix removed (``"ProcessPoolShutdownTest.
    test_del_shutdown"``); anything else (a fixture such as ``"tearDownModule (test.
    test_concurrent_futures.test_shutdown)"``) with the package name removed."""
    prefix = SUITE_PACKAGE + "."
    if not test_id.startswith(prefix):
        return test_id.replace(prefix, "")
    cls, _, method = test_id[len(prefix):].split(".", 1)[1].partition(".")
    return f"{cls.removeprefix('ProcessPool' + start_method.capitalize())}.{method}"


def _flatten(suite: unittest.TestSuite | unittest.TestCase) -> Iterator[unittest.TestCase]:
    if isinstance(suite, unittest.TestCase):
        yield suite
    else:
        for item in suite:
            yield from _flatten(item)


def selected_tests(pool_class: type, method: str, modules: list[str], skip: set[str],
                   keyword: str | None) -> list[unittest.TestCase]:
    """The tests of ``modules`` that run ``pool_class`` under ``method``, in module order.

    A test belongs to ``method`` when its class's mixin says ``ctx = method`` and its
    ``executor_type`` is pool's; test_init's ``FailingInitializerResourcesTest`` names the
    method in its test names (``test_spawn``, ``test_forkserver``). Thread-pool and
    interpreter-pool classes are left out."""
    loader = unittest.TestLoader()
    tests = []
    for name in modules:
        module = importlib.import_module(f"{SUITE_PACKAGE}.{name}")
        for test in _flatten(loader.loadTestsFromModule(module)):
            if getattr(test, "executor_type", None) is pool_class:
                keep = getattr(test, "ctx", None) == method
            elif type(test).__name__ == "FailingInitializerResourcesTest":
                keep = test._testMethodName == f"test_{method}"
            else:
                keep = False
            if keep and test.id() not in skip and (not keyword or keyword in test.id()):
                tests.append(test)
    return tests


class Recorder:
    """Appends JSON lines to the results file, each with a single ``write`` on an
    ``O_APPEND`` descriptor, so that a process killed at any instant leaves whole lines."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.set_inheritable(self.fd, False)

    def write(self, **record: Any) -> None:
        record["time"] = round(time.time(), 3)
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def short_traceback(text: str, lines: int = 25, chars: int = 4000) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


class Watchdog:
    """``faulthandler.dump_traceback_later(..., exit=True)`` with a deadline, kept out of
    forked children, writing to this process's real stderr.

    - A child forked while the watchdog runs inherits its state but not its thread: if the
      child then cancels or re-arms it (Python's own finalization cancels it), it waits
      forever for that thread. So it is cancelled just before every ``fork()`` and re-armed
      in the parent with the time that was left; children start without one.
    - It writes to a duplicate of descriptor 2 opened here, not to ``sys.stderr``: tests
      replace that with a ``StringIO`` (``support.captured_stderr()``), which has no
      descriptor, and a fork during such a test must still re-arm it.
    - Every path releases the lock (a fork handler that raised would otherwise leave it
      taken, and the next ``arm()`` would wait forever with no watchdog running)."""

    def __init__(self) -> None:
        self._deadline: float | None = None
        self._stream = open(os.dup(2), "w", closefd=True)
        self._lock = threading.Lock()  # no re-arming between a fork's before and after
        os.register_at_fork(before=self._before_fork, after_in_parent=self._after_in_parent,
                            after_in_child=self._after_in_child)

    def arm(self, seconds: float) -> None:
        with self._lock:
            self._deadline = time.monotonic() + seconds
            faulthandler.dump_traceback_later(seconds, exit=True, file=self._stream)

    def _before_fork(self) -> None:
        self._lock.acquire()
        try:
            if self._deadline is not None:
                faulthandler.cancel_dump_traceback_later()
        except BaseException:
            self._lock.release()
            raise

    def _after_in_parent(self) -> None:
        try:
            if self._deadline is not None:
                left = max(0.001, self._deadline - time.monotonic())
                faulthandler.dump_traceback_later(left, exit=True, file=self._stream)
        finally:
            self._lock.release()

    def _after_in_child(self) -> None:
        self._deadline = None
        self._lock = threading.Lock()


def watch_lifeline(fd: int) -> None:
    """Ends this run, with its process group, once the read end ``fd`` of a pipe whose
    only write end the caller holds reports end-of-file: the caller is gone (killed,
    say), and nobody would read or bound this run any more. (Pool workers lead groups of
    their own; they follow through their own lifelines once this process is gone.)"""
    def watch() -> None:
        while os.read(fd, 1):
            pass
        try:
            os.killpg(os.getpgid(0), 9)
        finally:
            os._exit(1)

    # A bare thread: not in threading.enumerate(), so the tests' own thread accounting
    # (threading_helper.threading_setup / threading_cleanup) never sees it.
    _thread.start_new_thread(watch, ())


def make_result_class(recorder: Recorder, watchdog: Watchdog, start_method: str,
                      test_timeout: float, fixture_timeout: float,
                      timeouts: dict[str, float]) -> type:
    class JsonLinesResult(unittest.TextTestResult):
        """Also writes each test's start and outcome to the results file, and arms the
        hang watchdog for each test and for what runs between tests."""

        def startTest(self, test: unittest.TestCase) -> None:
            self._outcome_of = "passed"
            self._details: list[str] = []
            self._started = time.monotonic()
            key = generic_key(test.id(), start_method)
            timeout = timeouts.get(key, timeouts.get(key.rpartition(".")[2], test_timeout))
            recorder.write(event="started", test=test.id(), timeout=timeout)
            watchdog.arm(timeout)
            super().startTest(test)

        def _text(self, err: Any, test: Any) -> str:
            # unittest's own rendering (private, but stable since 2.7); the tail is enough
            render = self._exc_info_to_string  # type: ignore[attr-defined]
            return short_traceback(render(err, test))

        def _note(self, outcome: str, detail: str) -> None:
            rank = ("passed", "skipped", "failed", "error")
            if rank.index(outcome) > rank.index(self._outcome_of):
                self._outcome_of = outcome
            self._details.append(detail)

        def stopTest(self, test: unittest.TestCase) -> None:
            super().stopTest(test)
            recorder.write(event="outcome", test=test.id(), outcome=self._outcome_of,
                           detail="\n---\n".join(self._details)[-6000:],
                           seconds=round(time.monotonic() - self._started, 2))
            # Module fixtures and cleanups run between tests: bound them too.
            watchdog.arm(fixture_timeout)

        def addError(self, test: Any, err: Any) -> None:
            super().addError(test, err)
            text = self._text(err, test)
            if isinstance(test, unittest.TestCase):
                self._note("error", text)
            else:  # setUpModule, tearDownClass, a module cleanup: not one test's outcome
                recorder.write(event="outcome", test=str(test), outcome="error", detail=text,
                               fixture=True)

        def addFailure(self, test: unittest.TestCase, err: Any) -> None:
            super().addFailure(test, err)
            self._note("failed", self._text(err, test))

        def addSubTest(self, test: unittest.TestCase, subtest: Any, err: Any) -> None:
            super().addSubTest(test, subtest, err)
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                self._note("failed" if failed else "error",
                           f"{subtest.id()}:\n{self._text(err, test)}")

        def addSkip(self, test: unittest.TestCase, reason: str) -> None:
            super().addSkip(test, reason)
            self._note("skipped", reason)

        def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
            super().addExpectedFailure(test, err)

        def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
            super().addUnexpectedSuccess(test)
            self._note("failed", "unexpected success")

    return JsonLinesResult


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start-method", choices=START_METHODS)
    parser.add_argument("--modules", default=",".join(MODULES),
                        help="comma-separated modules of test.test_concurrent_futures")
    parser.add_argument("--results", help="JSON-lines file to append to")
    parser.add_argument("--skip", action="append", default=[], metavar="TEST_ID",
                        help="a test id not to run (repeatable)")
    parser.add_argument("--skip-file", help="a file of test ids not to run, one a line")
    parser.add_argument("-k", dest="keyword", help="run only test ids containing this")
    parser.add_argument("--test-timeout", type=float, default=60.0,
                        help="seconds a test may take before the run is ended as hung")
    parser.add_argument("--timeout-for", action="append", default=[], metavar="KEY=SECONDS",
                        help="another --test-timeout for one test, named as generic_key() names"
                             " it, or by its method name (repeatable)")
    parser.add_argument("--fixture-timeout", type=float, default=30.0,
                        help="seconds what runs between two tests (module and class fixtures,"
                             " module cleanups) may take")
    parser.add_argument("--lifeline", type=int, metavar="FD",
                        help="the read end of a pipe whose end-of-file means: stop now")
    parser.add_argument("--exit-timeout", type=float, default=30.0,
                        help="seconds the interpreter's exit may take after the last test")
    parser.add_argument("--remove-hook", action="store_true",
                        help=f"delete {HOOK_FILE} from this interpreter's site-packages, and exit")
    args = parser.parse_args(argv)
    if args.remove_hook:
        for directory in site.getsitepackages():
            path = os.path.join(directory, HOOK_FILE)
            if os.path.exists(path):
                os.unlink(path)
                print(f"removed {path}")
        return 0
    if not args.start_method or not args.results:
        parser.error("--start-method and --results are required")
    modules = [m for m in args.modules.split(",") if m]
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown modules {unknown}; choose from {MODULES}")

    skip = set(args.skip)
    if args.skip_file:
        with open(args.skip_file) as f:
            skip.update(line.strip() for line in f if line.strip())

    if args.lifeline is not None:
        watch_lifeline(args.lifeline)
    recorder = Recorder(args.results)
    faulthandler.enable()
    watchdog = Watchdog()
    watchdog.arm(args.fixture_timeout + 60)  # imports and the hook's check
    try:
        pool = substitute()
        tests = selected_tests(pool.ProcessPool, args.start_method, modules, skip,
                               args.keyword)
    except BaseException as exc:
        recorder.write(event="fatal", detail="".join(traceback.format_exception(exc)))
        raise
    recorder.write(event="run", pid=os.getpid(), python=sys.version.split()[0],
                   start_method=args.start_method, modules=modules, pool=pool.__file__,
                   tests=[t.id() for t in tests])
    print(f"cpython_suite: {len(tests)} tests of {modules} with pool from {pool.__file__},"
          f" start method {args.start_method}", file=sys.stderr, flush=True)

    timeouts = {key: float(seconds)
                for key, _, seconds in (item.rpartition("=") for item in args.timeout_for)}
    result_class = make_result_class(recorder, watchdog, args.start_method, args.test_timeout,
                                     args.fixture_timeout, timeouts)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=result_class)
    result = runner.run(unittest.TestSuite(tests))
    recorder.write(event="finished", ran=result.testsRun)
    sys.stderr.flush()
    # A pool a test leaked is waited for at exit (the stdlib's promise): bound that too.
    watchdog.arm(args.exit_timeout)
    return 0


if __name__ == "__main__":  # spawn and forkserver workers import this file as __mp_main__
    sys.exit(main())

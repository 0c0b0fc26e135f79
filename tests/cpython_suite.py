"""Run CPython's own ``test.test_concurrent_futures`` process-pool tests against ``pool``.

Usage (one start method per run)::

    python tests/cpython_suite.py --start-method fork --results results.jsonl \
        [--modules test_process_pool,test_shutdown] [--skip TEST_ID ...] [-k SUBSTRING]

What it does:

- imports the *installed* ``pool`` (never the source tree: this script's directory is
  ``tests/``, which holds no ``pool``) and sets ``concurrent.futures.ProcessPoolExecutor``
  (and ``concurrent.futures.ProcessPool``) to ``pool.ProcessPool`` *before* importing the
  test modules, whose mixins capture ``futures.ProcessPoolExecutor`` when their classes
  are defined;
- makes child interpreters do the same: some tests run code in ``python -I -c ...`` (which
  ignores ``PYTHONPATH``) doing ``from concurrent.futures import ProcessPool``. A one-line
  ``.pth`` file (``HOOK_FILE``) in this interpreter's site-packages does the substitution
  there, only when ``HOOK_VARIABLE`` is set in the environment (it holds the directory
  the tested ``pool`` was imported from); unset, the line imports nothing but ``os``.
  The hook is checked in a child interpreter before any test runs;
- keeps only the process-pool test classes for the chosen start method, runs them with
  ``unittest`` and appends one JSON line per event to the results file: ``run`` (a
  header), ``started`` before each test, ``outcome`` after it (passed / failed / error /
  skipped, with the short traceback), ``finished`` at the end, so that a run killed by a
  hang says which test hung;
- bounds every test (and whatever runs between tests: module fixtures and cleanups) with
  ``faulthandler.dump_traceback_later(..., exit=True)``: a hang prints every thread's
  stack to stderr and ends the process with exit status 1. The interpreter's own exit
  (where a pool a test leaked would be waited for) is bounded the same way.

The caller (``tests/test_cpython_suite.py``) starts this in a session of its own, restarts
it after a hang with ``--skip`` for what already ran, and kills the whole session at the
end, so that nothing a test leaked outlives the run.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import site
import subprocess
import sys
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
    if proc.returncode != 0 or proc.stdout.strip() != pool_module.__file__:
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
    futures.ProcessPoolExecutor = pool.ProcessPool  # type: ignore[misc]
    futures.ProcessPool = pool.ProcessPool  # type: ignore[attr-defined]
    install_hook()
    check_hook(pool)
    return pool


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


def make_result_class(recorder: Recorder, test_timeout: float) -> type:
    class JsonLinesResult(unittest.TextTestResult):
        """Also writes each test's start and outcome to the results file, and arms the
        hang watchdog for each test and for what runs between tests."""

        def startTest(self, test: unittest.TestCase) -> None:
            self._outcome_of = "passed"
            self._details: list[str] = []
            self._started = time.monotonic()
            recorder.write(event="started", test=test.id())
            faulthandler.dump_traceback_later(test_timeout, exit=True)
            super().startTest(test)

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
            faulthandler.dump_traceback_later(test_timeout, exit=True)

        def addError(self, test: Any, err: Any) -> None:
            super().addError(test, err)
            text = short_traceback(self._exc_info_to_string(err, test))
            if isinstance(test, unittest.TestCase):
                self._note("error", text)
            else:  # setUpModule, tearDownClass, a module cleanup: not one test's outcome
                recorder.write(event="outcome", test=str(test), outcome="error", detail=text,
                               fixture=True)

        def addFailure(self, test: unittest.TestCase, err: Any) -> None:
            super().addFailure(test, err)
            self._note("failed", short_traceback(self._exc_info_to_string(err, test)))

        def addSubTest(self, test: unittest.TestCase, subtest: Any, err: Any) -> None:
            super().addSubTest(test, subtest, err)
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                self._note("failed" if failed else "error",
                           f"{subtest.id()}:\n"
                           + short_traceback(self._exc_info_to_string(err, test)))

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
    parser.add_argument("--start-method", required=True, choices=START_METHODS)
    parser.add_argument("--modules", default=",".join(MODULES),
                        help="comma-separated modules of test.test_concurrent_futures")
    parser.add_argument("--results", required=True, help="JSON-lines file to append to")
    parser.add_argument("--skip", action="append", default=[], metavar="TEST_ID",
                        help="a test id not to run (repeatable)")
    parser.add_argument("--skip-file", help="a file of test ids not to run, one a line")
    parser.add_argument("-k", dest="keyword", help="run only test ids containing this")
    parser.add_argument("--test-timeout", type=float, default=60.0,
                        help="seconds a test may take before the run is ended as hung")
    parser.add_argument("--exit-timeout", type=float, default=30.0,
                        help="seconds the interpreter's exit may take after the last test")
    args = parser.parse_args(argv)
    modules = [m for m in args.modules.split(",") if m]
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown modules {unknown}; choose from {MODULES}")

    skip = set(args.skip)
    if args.skip_file:
        with open(args.skip_file) as f:
            skip.update(line.strip() for line in f if line.strip())

    recorder = Recorder(args.results)
    faulthandler.enable()
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

    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2,
                                     resultclass=make_result_class(recorder, args.test_timeout))
    result = runner.run(unittest.TestSuite(tests))
    recorder.write(event="finished", ran=result.testsRun)
    sys.stderr.flush()
    # A pool a test leaked is waited for at exit (the stdlib's promise): bound that too.
    faulthandler.dump_traceback_later(args.exit_timeout, exit=True)
    return 0


if __name__ == "__main__":  # spawn and forkserver workers import this file as __mp_main__
    sys.exit(main())

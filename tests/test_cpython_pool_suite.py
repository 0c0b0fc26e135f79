"""CPython's own ``multiprocessing.Pool`` tests against ``pool.Pool``: the referee of the
``multiprocessing.Pool`` face, as ``test_cpython_suite.py`` is of the executor.

``cpython_pool_suite.py`` runs ``_TestPool``, ``_TestPoolWorkerErrors`` and
``_TestPoolWorkerLifetime`` of ``test/_test_multiprocessing.py`` (31 tests) with
``pool.patch()`` active, in a child interpreter under a hard timeout, once per start
method (about 5 s each), on every Python that ships CPython's tests (3.13, 3.14 and 3.15
here).
Any failure not in ``POOL_DIFFERENCES`` fails this test, and so does a listed one that now
passes.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from helpers import START_METHODS, TESTS_DIR

RUNNER = TESTS_DIR / "cpython_pool_suite.py"
TIMEOUT = 180

# Each difference, with its reason (docs/guide/mp_pool.rst lists them for users).
POOL_DIFFERENCES = {
    "WithProcessesTestPool.test_make_pool":
        "workers start with the first task, not in the constructor: len(p._pool) is 0 "
        "until then (as pool.ProcessPool's)",
    "WithProcessesTestPoolWorkerLifetime.test_pool_worker_lifetime":
        "the same: it reads len(p._pool) == 3 before any task",
    "WithProcessesTestPool.test_traceback":
        "the worker's real frames (tblib) are the exception's traceback; there is no "
        "RemoteTraceback __cause__ holding them as text (as pool.ProcessPool)",
    "WithProcessesTestPoolWorkerErrors.test_unpickleable_result":
        "its unpicklable result is a lambda, which pool sends back with cloudpickle; a "
        "value nothing can pickle does raise MaybeEncodingError (test_mp_pool.py)",
}


def _ships_the_suite(start_method: str) -> bool:
    try:
        return importlib.util.find_spec(
            f"test.test_multiprocessing_{start_method}.test_processes") is not None
    except ImportError:
        return False


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("start_method", START_METHODS)
def test_cpython_pool_tests(start_method, tmp_path):
    if not _ships_the_suite(start_method):
        pytest.skip("this Python does not ship CPython's multiprocessing tests")
    proc = subprocess.run([sys.executable, str(RUNNER), start_method], capture_output=True,
                          text=True, timeout=TIMEOUT, cwd=str(tmp_path))
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {"done": True} in records, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    outcomes = {r["test"]: (r["outcome"], r["detail"]) for r in records if "test" in r}
    not_passing = {name: detail for name, (outcome, detail) in outcomes.items()
                   if outcome in ("failed", "error")}
    passed = sorted(name for name, (outcome, _) in outcomes.items() if outcome == "passed")
    print(f"\nCPython's Pool tests against pool.Pool ({start_method}): {len(outcomes)} run, "
          f"{len(passed)} passed, {len(not_passing)} listed differences")
    assert len(outcomes) >= 30, outcomes
    unexpected = {name: detail for name, detail in not_passing.items()
                  if name not in POOL_DIFFERENCES}
    assert unexpected == {}
    now_passing = sorted(name for name in POOL_DIFFERENCES if name in passed)
    assert now_passing == [], "listed as differences, but now they pass"

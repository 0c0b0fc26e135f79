"""scikit-learn's tests of searches, validation and forests, run on loky and on pool: no test
may fail on pool that passes on loky.

Usage (tox's ``joblib`` environment runs it)::

    python tests/joblib_referee/same_as_loky.py [pytest options]

Each run makes its backend joblib's default and gives every ``Parallel`` whose ``n_jobs``
is not given 2 jobs (``pool_as_joblib_default``): scikit-learn's estimators leave it unset,
so their tests, written for one job, run on two worker processes. Some of those tests
cannot run in processes at all (a one-time generator as ``cv`` does not pickle; a warning
a worker emits is not seen by the test's ``pytest.warns``); they fail on both backends
alike. Printed: each test that ends differently. Exits 1 if a test fails on pool and
passes on loky, unless it is in ``TIMING``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

MODULES = ["sklearn.model_selection.tests.test_search",
           "sklearn.model_selection.tests.test_validation",
           "sklearn.ensemble.tests.test_forest"]
HERE = os.path.dirname(os.path.abspath(__file__))
messages: dict[str, str] = {}  # a test's failure on pool, as its report says it


def outcomes(backend: str, extra: list[str]) -> dict[str, str]:
    """Each test's outcome (passed, failed, error, skipped) on ``backend``."""
    with tempfile.TemporaryDirectory() as directory:
        report = os.path.join(directory, "report.xml")
        env = dict(os.environ, REFEREE_BACKEND=backend, REFEREE_N_JOBS="2",
                   PYTHONPATH=os.pathsep.join(filter(None, [HERE,
                                                             os.environ.get("PYTHONPATH")])))
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "-p", "pool_as_joblib_default",
                        "-q", "-p", "no:cacheprovider", "--timeout", "300",
                        f"--junit-xml={report}", "--pyargs", *MODULES, *extra],
                       env=env, cwd=directory, stdout=subprocess.DEVNULL, check=False,
                       timeout=3000)
        found: dict[str, str] = {}
        for case in ElementTree.parse(report).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            ends = [child for child in case if child.tag in ("failure", "error", "skipped")]
            found[name] = ends[0].tag if ends else "passed"
            if ends and backend == "pool":
                messages[name] = (ends[0].get("message") or "")[:500]
    counts = {kind: list(found.values()).count(kind) for kind in sorted(set(found.values()))}
    print(f"{backend}: {len(found)} tests in {time.monotonic() - started:.0f} s: {counts}",
          flush=True)
    return found


# Tests whose outcome with two jobs depends on which call ends first, on either backend (by
# name): several calls fail, each with its own message, and the test expects the first
# call's; with two jobs another may be reported first. Each failed here on loky too, one
# run in three to five.
TIMING = {
    "test_learning_curve_params": "every fit fails, with the size of its training set in "
                                  "the message",
    "test_cross_val_predict_decision_function_shape": "folds with different classes fail, "
                                                      "each naming its own",
}


def main() -> int:
    extra = sys.argv[1:]
    loky, pool = outcomes("loky", extra), outcomes("pool", extra)
    failed = ("failure", "error")
    differ = sorted(name for name in set(loky) | set(pool) if loky.get(name) != pool.get(name))
    worse = []
    for name in differ:
        if pool.get(name) in failed and loky.get(name) == "passed":
            reason = TIMING.get(name.rpartition("::")[2])
            print(f"  fails on pool, passes on loky: {name}"
                  + (f" (timing: {reason})" if reason else f"\n    {messages.get(name, '')}"))
            if reason is None:
                worse.append(name)
        else:
            print(f"  ends differently: {name}: loky {loky.get(name)}, pool {pool.get(name)}")
    both = sorted(name for name, end in pool.items() if end in failed and loky.get(name) == end)
    print(f"{len(both)} test(s) fail on both backends (they cannot run in processes: a "
          f"one-time generator as cv, warnings raised in a worker, classes defined in a test)")
    print(f"{len(worse)} test(s) fail on pool and pass on loky" if worse
          else "no test fails on pool that passes on loky")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())

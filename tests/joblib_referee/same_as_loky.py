"""scikit-learn's tests of searches, validation and forests, run on loky and on pool: every
test must end the same way on both.

Usage (tox's ``joblib`` environment runs it)::

    python tests/joblib_referee/same_as_loky.py [pytest options]

Each run makes its backend joblib's default and gives every ``Parallel`` whose ``n_jobs``
is not given 2 jobs (``pool_as_joblib_default``): scikit-learn's estimators leave it unset,
so their tests, written for one job, run on two worker processes. Some of those tests
cannot run in processes at all (a one-time generator as ``cv`` does not pickle); they fail
on both backends alike, and count as the same result. Exits 1 if any test ends differently,
and lists those.
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
            ends = [child.tag for child in case
                    if child.tag in ("failure", "error", "skipped")]
            found[name] = ends[0] if ends else "passed"
    counts = {kind: list(found.values()).count(kind) for kind in sorted(set(found.values()))}
    print(f"{backend}: {len(found)} tests in {time.monotonic() - started:.0f} s: {counts}",
          flush=True)
    return found


def main() -> int:
    extra = sys.argv[1:]
    loky, pool = outcomes("loky", extra), outcomes("pool", extra)
    differ = sorted(name for name in set(loky) | set(pool) if loky.get(name) != pool.get(name))
    for name in differ:
        print(f"  differs: {name}: loky {loky.get(name)}, pool {pool.get(name)}")
    same_failures = sorted(name for name, end in pool.items()
                           if end in ("failure", "error") and loky.get(name) == end)
    for name in same_failures:
        print(f"  fails on both (not a test that can run in processes): {name}")
    print("same results on both backends" if not differ
          else f"{len(differ)} test(s) end differently")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

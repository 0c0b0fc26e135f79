"""A pytest plugin (``-p pool_as_joblib_default``) that runs another project's test suite
with pool's backend as joblib's default: joblib's own ``test_parallel.py``, and the
selection of scikit-learn's tests in ``same_as_loky.py``.

- ``REFEREE_BACKEND`` (default ``pool``): the backend made joblib's default. ``loky`` leaves
  joblib's own, for the comparison runs.
- ``REFEREE_N_JOBS``: if set, every ``Parallel`` whose ``n_jobs`` is not given (the
  default of scikit-learn's estimators and searches) runs with this many jobs, so that
  their tests, written for one, run on the backend's processes.

joblib's tests that cannot hold with another default backend are marked as expected
failures (strict: one that starts to pass fails the run, and the list is corrected), each
with its reason: ``DIFFERENCES``.
"""

from __future__ import annotations

import os

import pytest
from joblib import parallel_config, register_parallel_backend

import pool.joblib

BACKEND = os.environ.get("REFEREE_BACKEND", "pool")
if BACKEND == "pool":
    register_parallel_backend("pool", pool.joblib.PoolBackend, make_default=True)
if os.environ.get("REFEREE_N_JOBS"):
    # Entered for the whole session, in the main thread, where the tests run.
    parallel_config(backend=BACKEND, n_jobs=int(os.environ["REFEREE_N_JOBS"])).__enter__()

# joblib's test_parallel.py, with pool as the default backend: what differs, and why (by
# test name).
_ANOTHER_PROCESS = ("a worker of another backend ({}) runs a nested Parallel(backend='pool'); "
                    "that process never imported pool.joblib, so joblib there has no "
                    "backend of that name (joblib finds only its own, dask's and ray's "
                    "without an import)")
DIFFERENCES = {
    "test_nested_loop[loky-pool]": _ANOTHER_PROCESS.format("loky"),
    "test_nested_loop[back_compat_backend-pool]":
        _ANOTHER_PROCESS.format("a multiprocessing.Pool"),
    "test_backend_hinting_and_constraints[parallel_config]":
        "the test expects prefer='processes' to pick loky; with pool the default, "
        "the default is already a process backend and is kept",
    "test_backend_hinting_and_constraints[parallel_backend]":
        "as for [parallel_config]: the same test through the older context manager",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if BACKEND != "pool":
        return
    for item in items:
        reason = DIFFERENCES.get(item.name)
        if reason is not None and item.path.name == "test_parallel.py":
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_report_header(config: pytest.Config) -> str:
    jobs = os.environ.get("REFEREE_N_JOBS")
    return (f"joblib's default backend: {BACKEND}"
            + (f"; Parallel's n_jobs when not given: {jobs}" if jobs else ""))

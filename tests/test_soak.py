"""A shortened soak (``benchmarks/soak.py``): a random mix of results, exceptions,
timeouts, ``stop()`` calls and outside SIGKILLs of workers and of the processes their
tasks start. Every future resolves exactly once, and nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO_DIR, START_METHODS, full_volume


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", START_METHODS)
def test_a_short_soak_loses_nothing_doubles_nothing_and_leaves_nothing(method):
    seconds = "4" if full_volume(method) else "1.5"
    proc = subprocess.run([sys.executable, str(REPO_DIR / "benchmarks" / "soak.py"),
                           "--seconds", seconds, "--start-method", method, "--json"],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout.splitlines()[-1])
    assert figures["lost"] == 0 and figures["doubled"] == 0, figures
    assert figures["end"]["workers_left"] == 0 and figures["end"]["children"] == 0, figures
    assert figures["end"]["threads"] == 1, figures
    assert figures["end"]["descriptors"] <= figures["start"]["descriptors"], figures
    assert sum(figures["outcomes"].values()) == figures["submitted"]
    for outcome in ("result", "ValueError", "TaskTimeout", "cancelled"):
        assert figures["outcomes"].get(outcome, 0) > 0, figures
    assert figures["worker_deaths"] > 0, figures

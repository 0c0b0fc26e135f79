"""``python -m pool``: the demo and the map command, run as real commands."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import START_METHODS, TESTS_DIR


def run(*args, stdin=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "pool", *args], input=stdin, text=True,
                          capture_output=True, timeout=timeout, cwd=str(TESTS_DIR))


@pytest.mark.parametrize("method", START_METHODS)
def test_demo_explains_both_deaths_and_the_timeout_and_the_rest_succeeds(method):
    proc = run("demo", "--start-method", method)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count(": ok,") == 4
    assert "signal SIGSEGV" in out and "Fatal Python error: Segmentation fault" in out
    assert "in segfault" in out
    assert "signal SIGKILL" in out and "killed from outside" in out
    assert "TaskTimeout" in out and "in catastrophic_regex" in out
    assert "the pool carried on" in out


def test_map_over_arguments_prints_results_in_order():
    proc = run("map", "-j", "2", "builtins:len", "a", "bbb", "cc")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "3", "2"]


def test_map_reads_stdin_reports_failures_and_exits_1():
    proc = run("map", "builtins:int", "--json", stdin="7\nnope\n-2\n")
    assert proc.returncode == 1
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0] == {"input": "7", "result": 7}
    assert lines[1]["input"] == "nope" and "ValueError" in lines[1]["error"]
    assert lines[2] == {"input": "-2", "result": -2}
    assert "input 'nope' failed: ValueError" in proc.stderr


def test_map_rejects_a_bad_function_name():
    proc = run("map", "no_such_module:thing", "1")
    assert proc.returncode == 2 and "cannot load" in proc.stderr

"""CPython's own ``test.test_concurrent_futures`` (its process-pool tests) against ``pool``:
the referee of DESIGN.md contract 7 ("drop-in").

For each start method, ``cpython_suite.py`` runs the suite in child interpreters (two
module groups at once, to keep within the time budget), each in a session of its own that
is killed when it ends, so nothing a test leaked survives; each also ends itself if this
process dies (``--lifeline``). A test that hangs is ended by the runner's watchdog
(``TEST_TIMEOUT``; what runs between tests, ``FIXTURE_TIMEOUT``), counts as ``hang``, and
the runner is restarted after it. The outcomes are compared with
``cpython_differences.DIFFERENCES``: any failure, error or hang not listed there fails this
test, and so does a listed one that now passes. A summary is printed for the CI log
either way; the runners' logs and JSON-lines results stay in the test's ``tmp_path``.

Each start method runs on one of the three Pythons by default (``METHODS_BY_PYTHON``): the
whole suite takes ~130 s per start method, and the three interpreters together cover all
three methods within CI's time budget. ``POOL_CPYTHON_ALL_METHODS=1`` runs every method on
every Python. Run one start method: ``pytest tests/test_cpython_suite.py -k spawn``.
Environment: ``POOL_CPYTHON_TEST_TIMEOUT`` (seconds per CPython test, default 60),
``POOL_CPYTHON_BUDGET`` (seconds per start method, restarts included, default 480).
"""

from __future__ import annotations

import collections
import concurrent.futures
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import cpython_differences
from cpython_suite import generic_key
from helpers import TESTS_DIR, session_members

RUNNER = TESTS_DIR / "cpython_suite.py"
PACKAGE = "test.test_concurrent_futures"
# Two groups run at once (measured without hangs: 3.13 spends most in the second, test_wait
# sleeps; 3.14 in the first, which starts a Manager per test).
GROUPS = (("test_process_pool", "test_init"),
          ("test_shutdown", "test_deadlock", "test_wait", "test_as_completed"))
TEST_TIMEOUT = float(os.environ.get("POOL_CPYTHON_TEST_TIMEOUT", "60"))
FIXTURE_TIMEOUT = 20.0  # what runs between tests: module fixtures and cleanups (~1 s)
# A test listed as hanging still runs (so that a fix shows), but is given up on sooner:
# CPython's tests take at most a few seconds when they pass.
EXPECTED_HANG_TIMEOUT = 15.0
BUDGET = float(os.environ.get("POOL_CPYTHON_BUDGET", "480"))
MAX_ATTEMPTS = 12  # per group: restarts after hangs
EXIT_TIMEOUT = 30.0  # the runner bounds its own exit (a leaked pool is waited for) by this
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# Which start methods each Python runs by default: each one's default method (3.13 fork,
# 3.14 forkserver), and spawn on the newest: every method and every Python that ships the
# suite once, within CI's time budget.
METHODS_BY_PYTHON = {"3.13": ("fork",), "3.14": ("forkserver",), "3.15": ("spawn",)}
ALL_METHODS = os.environ.get("POOL_CPYTHON_ALL_METHODS") == "1"
NOT_PASSING = ("failed", "error", "hang", "crash", "not run")


def _describe(pid: int) -> str:
    """The pid and command line, and whether it leads a process group (pool workers do;
    one that outlives the runner by seconds has missed its lifeline)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:100]
        leader = os.getpgid(pid) == pid
    except OSError:
        return f"{pid} (gone)"
    return f"{pid}{' [group leader]' if leader else ''} {command}"


def _end_session(sid: int, grace: float) -> list[str]:
    """Waits up to ``grace`` for the session to empty by itself (a forkserver or resource
    tracker ends on its own once the runner is gone), then SIGKILLs what is left until
    nothing is. Returns the processes that had to be killed (pid and command line)."""
    deadline = time.monotonic() + grace
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed: dict[int, str] = {}
    for _ in range(200):
        members = session_members(sid)
        if not members:
            break
        for pid in members:
            if pid not in killed:
                killed[pid] = _describe(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return [killed[pid] for pid in sorted(killed)]


def _read_records(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    whole = data[:data.rfind(b"\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()], offset + len(whole)


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _module_of(test_id: str) -> str:
    return test_id[len(PACKAGE) + 1:].split(".")[0]


@dataclass
class GroupRun:
    """One module group under one start method, restarted after each hang."""
    start_method: str
    modules: tuple[str, ...]
    workdir: Path
    deadline: float
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    runner_pid: int | None = None  # the session to kill if the test is interrupted
    aborted: bool = False

    def abort(self) -> None:
        """From another thread: stop now (Ctrl-C, pytest-timeout), killing the runner."""
        self.aborted = True
        if self.runner_pid is not None:
            _end_session(self.runner_pid, 0)

    @property
    def name(self) -> str:
        return "+".join(m.removeprefix("test_") for m in self.modules)

    def run(self) -> GroupRun:
        results = self.workdir / f"{self.name}.jsonl"
        skip_file = self.workdir / f"{self.name}.skip"
        offset = 0
        planned: list[str] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            if self.aborted:
                raise RuntimeError("aborted")
            skip_file.write_text("".join(f"{test}\n" for test in self.outcomes))
            log = self.workdir / f"{self.name}.{attempt}.log"
            self.logs.append(log)
            records, offset, rc, cut = self._attempt(results, offset, skip_file, log)
            fatal = [r["detail"] for r in records if r["event"] == "fatal"]
            if fatal or not any(r["event"] == "run" for r in records):
                raise AssertionError(f"the runner for {self.name} ({self.start_method}) failed"
                                     f" before running tests (exit {rc}):\n"
                                     + (fatal[0] if fatal else _tail(log)))
            header = next(r for r in records if r["event"] == "run")
            planned = planned or header["tests"]
            last = None
            for record in records:
                if record["event"] == "started":
                    last = record
                elif record["event"] == "outcome":
                    self.outcomes[record["test"]] = record
                    last = record
            finished = any(r["event"] == "finished" for r in records)
            # faulthandler's watchdog (exit=True) writes "Timeout (h:mm:ss)!" and exits with 1
            hung = cut or (rc == 1 and "Timeout (" in _tail(log, 10**6))
            if finished:
                if rc != 0:
                    what = "hung" if hung else "failed"
                    self._add("(interpreter exit)", "hang" if hung else "crash",
                              f"the runner's exit after its last test {what} (exit {rc}):\n"
                              f"{_tail(log)}")
                return self
            outcome = "hang" if hung else "crash"

            def why(limit: float) -> str:
                if cut:
                    return "its watchdog did not end the runner: killed at the time budget"
                return f"did not end in {limit:g} s" if hung else f"the runner died (exit {rc})"

            if last is not None and last["event"] == "started":
                culprit = last["test"]
                detail = why(last.get("timeout", TEST_TIMEOUT))
            elif last is None:  # in the set-up before the first test
                first = header["tests"][0] if header["tests"] else f"{PACKAGE}.?"
                culprit = f"setUpModule ({PACKAGE}.{_module_of(first)})"
                detail = f"{why(FIXTURE_TIMEOUT)} before the first test"
            else:  # between tests: a fixture or module cleanup
                before = last["test"]
                rest = [t for t in planned if t not in self.outcomes]
                if not rest or _module_of(rest[0]) != _module_of(before):
                    culprit = f"tearDownModule ({PACKAGE}.{_module_of(before)})"
                else:
                    culprit = f"{before} [after]"
                detail = f"{why(FIXTURE_TIMEOUT)} after {before}"
            self._add(culprit, outcome, f"{detail}; the runner's last output:\n{_tail(log)}")
            if cut or time.monotonic() >= self.deadline:
                break
            if not [t for t in planned if t not in self.outcomes]:
                return self
        for test in planned:
            if test not in self.outcomes:
                self._add(test, "not run", "the time budget or the restarts ran out")
        return self

    def _add(self, test: str, outcome: str, detail: str) -> None:
        self.outcomes[test] = {"test": test, "outcome": outcome, "detail": detail}

    def _attempt(self, results: Path, offset: int, skip_file: Path,
                 log: Path) -> tuple[list[dict[str, Any]], int, int | None, bool]:
        """Runs the runner once; returns its new records, the new offset, its exit status
        and whether our own hard timeout had to cut it (the runner's watchdog failed)."""
        args = [sys.executable, str(RUNNER), "--start-method", self.start_method,
                "--modules", ",".join(self.modules), "--results", str(results),
                "--skip-file", str(skip_file), "--test-timeout", str(TEST_TIMEOUT),
                "--fixture-timeout", str(FIXTURE_TIMEOUT),
                *(f"--timeout-for={key}={EXPECTED_HANG_TIMEOUT}"
                  for key in cpython_differences.listed(self.start_method, PYTHON,
                                                        outcome="hang")),
                "--exit-timeout", str(EXIT_TIMEOUT)]
        env = dict(os.environ, PYTHONFAULTHANDLER="1")
        cut = False
        # The runner ends itself when this pipe closes: if this process dies (SIGKILL, say),
        # nothing it started runs on unwatched.
        lifeline_r, lifeline_w = os.pipe()
        try:
            with open(log, "wb") as out:
                proc = subprocess.Popen(args + ["--lifeline", str(lifeline_r)],
                                        stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, cwd=self.workdir, env=env,
                                        start_new_session=True, pass_fds=(lifeline_r,))
        except BaseException:
            os.close(lifeline_w)
            raise
        finally:
            os.close(lifeline_r)
        self.runner_pid = proc.pid
        if self.aborted:  # abort() ran before it could see this runner
            _end_session(proc.pid, 0)
        try:
            proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            cut = True
            self.notes.append(f"{self.name}: hard timeout: the runner was killed")
        finally:
            killed = _end_session(proc.pid, 0 if cut else 3.0)
            proc.kill()  # already dead unless cut; reaps it either way
            proc.wait()
            os.close(lifeline_w)
            self.runner_pid = None
        if killed and not cut:
            self.notes.append(f"{self.name} ({log.name}): {len(killed)} processes outlived "
                              f"the runner (exit {proc.returncode}) by 3 s and were killed: "
                              + "; ".join(killed)
                              + (" (the runner was cut short: what the test running then had"
                                 " started was never shut down)" if proc.returncode else ""))
        records, offset = _read_records(results, offset)
        return records, offset, proc.returncode, cut


def _gist(outcome: str, detail: str) -> str:
    """One line: the exception a failure ended with, or what a hang or crash was."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    if not lines:
        return ""
    return (lines[-1] if outcome in ("failed", "error") else lines[0])[:200]


# Lines of the runners' output worth a count in the summary, as (marker, regex to
# normalise them with: pids, addresses, counts and durations do not make a new kind).
_WARNING_MARKERS = ("resource_tracker:", "leaked", "threading_cleanup() failed",
                    "Dangling thread: <Thread", "could not be reaped", "reap_children()",
                    "ResourceWarning", "Exception in thread", "Exception ignored")
_VARYING = re.compile(r"^\d+\.\d+s |0x[0-9a-f]+|\d+|'/mp-[^']*'")


def _warnings(logs: list[Path]) -> collections.Counter[str]:
    found: collections.Counter[str] = collections.Counter()
    for log in logs:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if any(marker in line for marker in _WARNING_MARKERS):
                found[_VARYING.sub("N", line.strip())[:160]] += 1
    return found


@pytest.mark.timeout(BUDGET + 120)
def test_cpython_suite(start_method: str, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    if sys.version_info < (3, 13):
        # The differences are established against 3.13's, 3.14's and 3.15's suites, which
        # are the ones our machines carry (pyenv's 3.11 and 3.12 builds ship none).
        pytest.skip("CPython's suite is run on 3.13, 3.14 and 3.15")
    if not ALL_METHODS and start_method not in METHODS_BY_PYTHON.get(PYTHON, ()):
        pytest.skip(f"{start_method} runs CPython's suite on another Python"
                    " (POOL_CPYTHON_ALL_METHODS=1 runs it here too)")
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except ImportError:  # no ``test`` package at all
        spec = None
    # (Up to 3.11 it is one module, test_concurrent_futures.py, which the runner cannot split
    # by start method; since 3.12 a package.)
    if spec is None or spec.submodule_search_locations is None:
        message = f"Python {PYTHON} here does not ship {PACKAGE} as a package"
        if sys.version_info >= (3, 13):  # CI provides it there: its absence is a failure
            pytest.fail(message + " (install the interpreter's test package)")
        pytest.skip(message)
    deadline = time.monotonic() + BUDGET
    started = time.monotonic()
    groups = [GroupRun(start_method, modules, tmp_path, deadline) for modules in GROUPS]
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as threads:
        try:
            for done in [threads.submit(group.run) for group in groups]:
                done.result()
        except BaseException:  # Ctrl-C, pytest-timeout, a runner that failed to start
            pending = list(groups)
            while pending:
                try:
                    pending[0].abort()
                    pending.pop(0)
                except KeyboardInterrupt:  # a second Ctrl-C: stop every runner first
                    pass
            raise
    elapsed = time.monotonic() - started

    counts: collections.Counter[str] = collections.Counter()
    expected: list[str] = []
    unexpected: list[tuple[str, str, str]] = []
    now_pass: list[str] = []
    stale_skips: list[str] = []
    seen = set()
    for group in groups:
        for test_id, record in group.outcomes.items():
            key = generic_key(test_id, start_method)
            seen.add(key)
            outcome = record["outcome"]
            counts[outcome] += 1
            difference = cpython_differences.lookup(key, start_method, PYTHON)
            if difference is None:
                if outcome in NOT_PASSING:
                    unexpected.append((f"{key}: {outcome}", outcome, record["detail"]))
            elif outcome in difference.outcomes:
                expected.append(f"{key}: {outcome} ({difference.reason})")
            elif outcome == "passed":
                now_pass.append(f"{key}: passes now; remove it from tests/cpython_differences.py"
                                f" ({difference.reason})")
            elif outcome == "skipped":
                stale_skips.append(key)
            else:
                listed_as = "/".join(sorted(difference.outcomes))
                unexpected.append((f"{key}: {outcome} (listed as {listed_as})", outcome,
                                   record["detail"]))
    listed_unseen = sorted(key for key in cpython_differences.listed(start_method, PYTHON)
                           if key not in seen and not any(k.endswith("." + key) for k in seen))
    notes = [note for group in groups for note in group.notes]
    warnings = _warnings([log for group in groups for log in group.logs])

    lines = [f"CPython test_concurrent_futures vs pool: Python {PYTHON}, {start_method}:"
             f" {sum(counts.values())} tests in {elapsed:.0f} s: "
             + ", ".join(f"{counts[o]} {o}" for o in ("passed", "skipped", *NOT_PASSING)
                         if counts[o])
             + f"; {len(expected)} expected differences, {len(unexpected)} unexpected,"
               f" {len(now_pass)} listed but passing (logs in {tmp_path})"]
    lines += [f"  expected  {line}" for line in sorted(expected)]
    lines += [f"  UNEXPECTED {what}: {_gist(outcome, detail)}"
              for what, outcome, detail in sorted(unexpected)]
    lines += [f"  PASSES    {line}" for line in sorted(now_pass)]
    lines += [f"  note      listed but skipped here: {key}" for key in stale_skips]
    lines += [f"  note      listed but not seen: {key}" for key in listed_unseen]
    lines += [f"  note      {note}" for note in notes]
    lines += [f"  warning   {count}x {line}" for line, count in warnings.most_common(8)]
    with capsys.disabled():
        print("\n" + "\n".join(lines), flush=True)

    problems = [f"{what}\n{detail}" for what, _, detail in unexpected] + now_pass
    if problems:
        pytest.fail(f"{len(unexpected)} unexpected outcomes and {len(now_pass)} listed"
                    " differences that pass now:\n\n" + "\n\n".join(problems), pytrace=False)

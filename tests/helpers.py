"""Process-level facts for the tests: children, descriptors, threads, child interpreters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
START_METHODS = ("fork", "forkserver", "spawn")

# The volume tests (a thousand deaths, 256 workers, the soak, the stress batch) run in full
# for some start methods on each Python, so that across the tox matrix every method meets
# them in full on at least one Python, and the newest on all three; elsewhere they run
# shortened, or not at all where a smaller run would not test their point (256 workers:
# more descriptors than select() can watch). One suite then takes a fifth less CPU, and
# the matrix fits CI's half hour. POOL_FULL_VOLUME=1 runs all of them in full.
FULL_VOLUME_METHODS = {
    "3.11": ("fork",),
    "3.12": ("forkserver",),  # CI runs 3.12 on the portable path (POOL_PORTABLE=1)
    "3.13": ("fork",),
    "3.14": ("forkserver",),  # its default method
    "3.15": START_METHODS,
}


def full_volume(method: str) -> bool:
    """Whether this Python runs the volume tests in full for ``method``."""
    if os.environ.get("POOL_FULL_VOLUME") == "1":
        return True
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return method in FULL_VOLUME_METHODS.get(python, START_METHODS)


def _live_processes() -> list[tuple[int, int, int, int]]:
    """(pid, parent pid, process group, session) of every live (non-zombie) process, from
    /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            found.append((int(entry), int(fields[1]), int(fields[2]), int(fields[3])))
    return found


def children_of(pid: int) -> set[int]:
    """Live (non-zombie) direct children of ``pid``."""
    return {child for child, parent, _, _ in _live_processes() if parent == pid}


def process_exists(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def open_fds() -> set[int]:
    # (Includes the descriptor listdir itself opens; every snapshot has one alike.)
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (for facts that the kernel
    settles asynchronously, such as a reparented orphan being reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def helper_pids() -> set[int]:
    """multiprocessing's long-lived helpers (forkserver, resource tracker), not leaks."""
    from multiprocessing import forkserver, resource_tracker
    pids = (getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None))
    return {pid for pid in pids if pid}


def new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


PRELUDE = '''
import json, os, sys, signal, time, threading, multiprocessing
sys.path[:0] = [{tests!r}]  # tasks and helpers; pool itself comes from the installation
import pool, tasks, helpers
METHOD = os.environ["POOL_TEST_START_METHOD"]
CTX = multiprocessing.get_context(METHOD)

def report(**facts):
    facts["children_left"] = sorted(helpers.children_of(os.getpid()) - helpers.helper_pids())
    facts["threads_left"] = sorted(t.name for t in threading.enumerate()
                                   if t is not threading.main_thread() and t.is_alive()
                                   and not t.daemon)
    print("REPORT " + json.dumps(facts), flush=True)
'''


def run_script(body: str, method: str, tmp_path: Path, *, timeout: float = 90,
               expect_exit: int | None = 0, env: dict[str, str | None] | None = None
               ) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run a scenario in a child interpreter (as a script file, so that spawn and
    forkserver workers can import its ``__main__``) with a hard timeout; returns the
    dict it passed to ``report()`` and the completed process. ``env``: variables to set
    for it, or to remove (None)."""
    script = tmp_path / "scenario.py"
    guarded = "\nif __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    ")
    script.write_text(PRELUDE.format(tests=str(TESTS_DIR)) + guarded)
    child_env = dict(os.environ, POOL_TEST_START_METHOD=method, PYTHONFAULTHANDLER="1")
    for name, value in (env or {}).items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout, env=child_env, cwd=str(tmp_path))
    if expect_exit is not None:
        assert proc.returncode == expect_exit, (
            f"scenario exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    reports = [line[len("REPORT "):] for line in proc.stdout.splitlines()
               if line.startswith("REPORT ")]
    facts = json.loads(reports[-1]) if reports else {}
    return facts, proc


def communicate_or_kill(proc: subprocess.Popen[str], timeout: float
                        ) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of a child started with pipes; killed (and
    reaped) if it has not ended in ``timeout`` seconds, which then raises."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


class Scenario:
    """A scenario script running in its own session (so its process group can be signalled
    as a terminal would), read line by line; always killed with its group on close."""

    def __init__(self, body: str, method: str, tmp_path: Path) -> None:
        script = tmp_path / "scenario.py"
        guarded = "\nif __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(body), "    ")
        script.write_text(PRELUDE.format(tests=str(TESTS_DIR)) + guarded)
        env = dict(os.environ, POOL_TEST_START_METHOD=method, PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, bufsize=0,
                                     cwd=str(tmp_path), start_new_session=True)
        self.lines: list[str] = []
        self._pending = ""

    def read_until(self, prefix: str, timeout: float = 60) -> str:
        """The first stdout line starting with ``prefix`` (without it)."""
        import select
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while "\n" in self._pending:
                line, self._pending = self._pending.split("\n", 1)
                self.lines.append(line)
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 65536)  # the raw pipe: nothing hides in a Python buffer
            if not chunk:
                break
            self._pending += chunk.decode()
        raise AssertionError(f"no {prefix!r} line; got {self.lines}\n{self.stderr()}")

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    def signal_group(self, signum: int) -> float:
        """Send ``signum`` to the scenario's whole process group; returns the send time."""
        sent = time.monotonic()
        os.killpg(self.proc.pid, signum)
        return sent

    def signal_leader(self, signum: int) -> float:
        """Send ``signum`` to the scenario's own process only; returns the send time."""
        sent = time.monotonic()
        os.kill(self.proc.pid, signum)
        return sent

    def wait(self, timeout: float = 30) -> tuple[int, float, str, str]:
        """Exit code, the time it exited (monotonic), the rest of stdout, and stderr.
        If it does not end in time, it is made to write every thread's stack (SIGABRT:
        faulthandler is on), which the AssertionError shows."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGABRT)
            try:
                out, err = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                out, err = "", "(no stack: it did not end on SIGABRT either)"
            raise AssertionError(f"the scenario did not end in {timeout} s; its stdout:\n"
                                 f"{self._pending + out}\nits stderr:\n{err}") from None
        return self.proc.returncode, time.monotonic(), self._pending + out, err

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.communicate()


def group_members(pgid: int) -> set[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    return {pid for pid, _, group, _ in _live_processes() if group == pgid}


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid`` (pool workers lead process groups of
    their own, but stay in the session that started them)."""
    return [pid for pid, _, _, session in _live_processes() if session == sid]


def run_scenario_in_session(script: Path, env: dict[str, str], timeout: float
                            ) -> dict[str, Any]:
    """Runs ``script`` in a child interpreter in a session of its own, under a hard
    timeout (then SIGABRT to the session: faulthandler writes every thread's stack), and
    fails the test unless it exits 0, says ``REPORT {json}`` on standard output, and every
    process of its session is gone afterwards. Returns the last report, with the script's
    standard error as ``"stderr"``."""
    import pytest
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(script.parent), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *session_members(proc.pid)]:  # (workers lead groups of their own)
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the scenario did not end in {timeout} s\n{out}\n{err[-8000:]}")
    finally:
        gone = wait_until(lambda: not session_members(proc.pid), 15)
        if not gone:
            for pid in session_members(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err[-8000:]}"
    assert gone, "processes were left behind"
    reports = [line[len("REPORT "):] for line in out.splitlines() if line.startswith("REPORT ")]
    assert reports, f"no report\n{out}\n{err[-8000:]}"
    facts: dict[str, Any] = json.loads(reports[-1])
    facts["stderr"] = err
    return facts

"""The shake: every signal and exit path of pool, run many times on a starved CPU with the
threads' interleavings shaken, checked for hangs, lost futures and orphans.

Each run is one child interpreter in a session of its own, running one path (a
``ProcessPool`` in ``submit``, ``result()``, ``map``, ``shutdown``, a ``with`` exit,
interpreter exit, an ``asyncio`` cancellation; or ``python -m pool map`` reading its
input, blocked writing, behind ``| head``, with a job log). Its pool's points
(``pool._shake``) sleep at random, threads switch every 10 us, and busy processes (two per
core by default) compete for the CPU. At a random moment after the path begins, the run
gets SIGINT (to its process group, as Ctrl-C does), SIGTERM, or SIGKILL of the parent.

A run passes when:
- it exits within ``EXIT_BOUND`` seconds of the signal (else it is a hang: it is made
  to write every thread's stack, which the report shows);
- no process of its session is left ``ORPHAN_BOUND`` seconds after it exited (its
  workers, their children, the forkserver and the resource tracker all carry the session);
- every future it made is done when its last exit hook runs (when it lived to run one);
- its exit status is one the path documents, and the command line wrote at most one line
  to standard error.

Run it long from a checkout (docs/development.rst, "The shake")::

    python tests/shake.py --runs 2000 --methods fork,forkserver,spawn

``tests/test_shake.py`` runs a short one in the suite, and pins each race the shake found
with a fixed delay at the point that opens it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR))
from helpers import START_METHODS, session_members  # noqa: E402
from shake_paths import (COMMANDS, PATHS, PRELUDE, SCRIPTS,  # noqa: E402
                         SLOW_PRODUCER)

EXIT_BOUND = 20.0     # seconds from the signal to the run's exit: longer is a hang
ORPHAN_BOUND = 10.0   # seconds from the exit until every process of the run is gone
START_BOUND = 90.0    # seconds until the path begins (a start under heavy load is slow)

SIGINT, SIGTERM, SIGKILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL

# How threading reports an exception that ended one of its exit hooks: a Ctrl-C at the
# first line of pool's, which pool's atexit safety net then answers (3.11 to 3.13, 3.14).
THREADING_IGNORED_IT = re.compile(
    r"^Exception ignored (in: <module 'threading'|on threading shutdown)", re.M)

@dataclasses.dataclass
class Outcome:
    path: str
    method: str
    seed: int
    signal: str
    ended_first: bool = False               # it had exited before the signal was sent
    seconds_to_exit: float | None = None    # from the signal to its exit
    status: int | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    detail: str = ""


def _environment(method: str, seed: int, rng: random.Random) -> dict[str, str]:
    # Mostly short delays; now and then long ones, which reorder far more.
    longest = rng.choice((0.001, 0.005, 0.005, 0.02))
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, SHAKE_METHOD=method, PYTHONFAULTHANDLER="1", PYTHONPATH=path,
                POOL_SHAKE=f"seed={seed},max={longest},p=0.3")


# The signals a run may get (``--signals`` narrows it).
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")
_signals = set(SIGNALS)


def _pick_signal(rng: random.Random, path: str) -> tuple[str, int, bool]:
    """(name, signal, to the whole group): Ctrl-C half the time, else SIGTERM or the
    parent killed."""
    roll = rng.random()
    while ("SIGINT" if roll < 0.5 else "SIGTERM" if roll < 0.75 else "SIGKILL") not in _signals:
        roll = rng.random()
    if roll < 0.5:
        return "SIGINT", SIGINT, True
    if roll < 0.75:
        return "SIGTERM", SIGTERM, path in COMMANDS and rng.random() < 0.5
    return "SIGKILL", SIGKILL, False


def _read_line(fd: int, timeout: float, buffer: bytearray) -> bytes | None:
    """The next line from ``fd`` (kept in ``buffer``), or None at end or after ``timeout``."""
    import select
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def run_once(path: str, method: str, seed: int, python: str = sys.executable) -> Outcome:
    rng = random.Random(seed)
    name, signum, to_group = _pick_signal(rng, path)
    outcome = Outcome(path, method, seed, name)
    with tempfile.TemporaryDirectory(prefix="pool-shake-") as directory:
        procs, main, session, reads = _start(path, method, seed, python, directory)
        buffer = bytearray()
        try:
            if _read_line(reads, START_BOUND, buffer) is None and main.poll() is None:
                outcome.problems.append("never began")
            # (Behind ``| head``, the command ends moments after head's one line.)
            time.sleep(rng.random() * (0.05 if path == "map-head" else 0.5))
            sent = time.monotonic()
            outcome.ended_first = main.poll() is not None
            if not outcome.ended_first:   # (else its pid may be another's by now)
                if to_group:   # Ctrl-C: the whole pipeline gets it
                    # The program first: were the producer first, this thread could be
                    # switched out between the two, and the program could read to the end
                    # of its input, finish and exit 0 before its signal came.
                    try:
                        os.killpg(session, signum)
                    except ProcessLookupError:
                        pass
                    for proc in procs:
                        if proc is not main:
                            proc.send_signal(signum)
                else:
                    main.send_signal(signum)
            # (map-write: the harness reads no more, so the command is blocked writing.)
            out, err = _wait(main, reads, buffer, sent, path != "map-write", outcome)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            os.close(reads)
        left = _left_in_session(session)
        if left:
            outcome.problems.append(f"orphans {left}")
            for pid in left:
                try:
                    os.kill(pid, SIGKILL)
                except ProcessLookupError:
                    pass
        _check(path, signum, main.returncode, out, err, outcome, directory)
    return outcome


def _start(path: str, method: str, seed: int, python: str, directory: str
           ) -> tuple[list[subprocess.Popen[bytes]], subprocess.Popen[bytes], int, int]:
    """The run's processes, the one whose exit is checked, the session they are in, and
    a descriptor its results are read from."""
    env = _environment(method, seed, random.Random(-seed))
    if path in SCRIPTS:
        script = Path(directory, "scenario.py")
        body = textwrap.indent(textwrap.dedent(SCRIPTS[path]), "    ")
        script.write_text(PRELUDE.format(tests=str(TESTS_DIR))
                          + "\nif __name__ == '__main__':\n" + body)
        command = [python, *(["-m", "pool", "run"] if path.endswith("pool-run") else []),
                   str(script)]
        main = subprocess.Popen(command, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=directory,
                                start_new_session=True)
        assert main.stdout is not None
        return [main], main, main.pid, os.dup(main.stdout.fileno())
    function, extra, behind_head = COMMANDS[path]
    extra = [arg.format(dir=directory) for arg in extra]
    # The command leads a session of its own (the orphan check looks there); the
    # producer and ``head`` are the harness's, and get the group's signal by hand.
    # (Its own death by a closed pipe or the signal is no news: its stderr is dropped.)
    producer = subprocess.Popen(SLOW_PRODUCER if path == "map-read" else ["seq", "1", "100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    main = subprocess.Popen(
        [python, "-m", "pool", "map", function, "-j", "2", "--start-method", method, *extra],
        stdin=producer.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        cwd=directory, start_new_session=True)
    assert producer.stdout is not None and main.stdout is not None
    producer.stdout.close()
    procs = [producer, main]
    out = main.stdout
    if behind_head:
        head = subprocess.Popen(["head", "-n", "1"], stdin=main.stdout,
                                stdout=subprocess.PIPE)
        assert head.stdout is not None
        main.stdout.close()
        procs.append(head)
        out = head.stdout
    return procs, main, main.pid, os.dup(out.fileno())


def _wait(main: subprocess.Popen[bytes], reads: int, buffer: bytearray, sent: float,
          reading: bool, outcome: Outcome) -> tuple[str, str]:
    """Waits for the run to exit, reading its output; a run still there after
    EXIT_BOUND is a hang, and is made to write its threads' stacks (faulthandler)."""
    import select
    assert main.stderr is not None
    err_fd = main.stderr.fileno()
    out = bytearray(buffer)
    err = bytearray()
    watched = [err_fd] + ([reads] if reading else [])
    deadline = sent + EXIT_BOUND
    exited_at = None
    while True:
        now = time.monotonic()
        if exited_at is None and main.poll() is not None:
            exited_at = now
            outcome.seconds_to_exit = now - sent
        # After the exit, the pipes are read to their end; workers that outlive it hold
        # them open, and are the orphan check's to report.
        if exited_at is not None and (not watched or now > exited_at + 2.0):
            break
        if exited_at is None and now > deadline:
            break
        ready = select.select(watched, [], [], 0.05)[0] if watched else time.sleep(0.01)
        for fd in ready or ():
            chunk = os.read(fd, 65536)
            if not chunk:
                watched.remove(fd)
            else:
                (err if fd == err_fd else out).extend(chunk)
    if exited_at is None:
        outcome.problems.append(f"hang: still running {EXIT_BOUND:g} s after {outcome.signal}")
        main.send_signal(signal.SIGABRT)   # faulthandler writes every thread's stack
        try:
            main.wait(10)
        except subprocess.TimeoutExpired:
            pass
        while select.select([err_fd], [], [], 0.5)[0]:
            chunk = os.read(err_fd, 65536)
            if not chunk:
                break
            err.extend(chunk)
    return out.decode(errors="replace"), err.decode(errors="replace")


def _left_in_session(session: int) -> list[int]:
    deadline = time.monotonic() + ORPHAN_BOUND
    while True:
        left = session_members(session)
        if not left or time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.02)


def _check(path: str, signum: int, status: int | None, out: str, err: str,
           outcome: Outcome, directory: str) -> None:
    outcome.status = status
    futures = [line.split() for line in out.splitlines() if line.startswith("FUTURES ")]
    if path in SCRIPTS:
        # No script ends by itself before its long task (LONG) would: a status of 0 after
        # the signal means a Ctrl-C stopped the exit hook's wait, which then ends
        # normally. Only interpreter exit has that wait.
        allowed = {-signum} | ({0} if path == "interpreter-exit" and signum == SIGINT else set())
        if futures and int(futures[-1][2]):
            outcome.problems.append(f"{futures[-1][2]} of {futures[-1][1]} futures not done")
        if signum == SIGINT and status == -SIGINT and not futures:
            outcome.problems.append("no check of the futures: the exit hooks did not run")
        # threading prints a Ctrl-C at the exit hook's first line as ignored, and pool's
        # atexit safety net then stops the pools (``_exit._stop_what_the_hook_left``).
        err_lines = err.splitlines()
        bad = [line for number, line in enumerate(err_lines)
               if ("Exception ignored" in line
                   and not (THREADING_IGNORED_IT.match(line)
                            and "KeyboardInterrupt" in "".join(err_lines[number:])))
               or "Fatal Python error" in line or "internal error" in line.lower()]
        if bad:
            outcome.problems.append(f"stderr: {bad[0]}")
    else:
        allowed = {-signum}
        if path == "map-head":
            allowed.add(141)
        lines = err.splitlines()
        if len(lines) > 1:
            outcome.problems.append(f"{len(lines)} lines on stderr")
        if path == "map-joblog":
            _check_joblog(Path(directory, "joblog"), outcome)
    if outcome.ended_first:
        allowed = {0, 141} if path == "map-head" else {0}
    if status not in allowed and not any(p.startswith("hang") for p in outcome.problems):
        outcome.problems.append(f"exit status {status}, expected one of {sorted(allowed)}")
    if outcome.problems:
        outcome.detail = err[-6000:]


def _check_joblog(joblog: Path, outcome: Outcome) -> None:
    if not joblog.exists():
        return
    from pool._cli.joblog import COLUMNS
    lines = joblog.read_text().splitlines()
    broken = [line for line in lines[1:] if len(line.split("\t")) != len(COLUMNS)]
    if broken:
        outcome.problems.append(f"joblog: {len(broken)} broken lines, first {broken[0]!r}")


# -- many runs --------------------------------------------------------------------------

class Busy:
    """Processes that only spin, to starve the runs of CPU."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(count)]

    def __enter__(self) -> Busy:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def plan(runs: int, methods: list[str], paths: list[str], seed: int
         ) -> Iterator[tuple[str, str, int]]:
    """``runs`` runs, round robin over paths and methods, each with its own seed."""
    cycle = itertools.cycle(itertools.product(paths, methods))
    for number in range(runs):
        path, method = next(cycle)
        yield path, method, seed * 1_000_003 + number


def shake(runs: int, methods: list[str], paths: list[str], seed: int, jobs: int,
          python: str = sys.executable, report: bool = True) -> list[Outcome]:
    from concurrent.futures import ThreadPoolExecutor
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(jobs) as threads:
        for outcome in threads.map(lambda job: run_once(*job, python=python),
                                   plan(runs, methods, paths, seed)):
            outcomes.append(outcome)
            if report and outcome.problems:
                print(f"FAILED {outcome.path}:{outcome.method}:{outcome.seed} {outcome.signal}: "
                      f"{'; '.join(outcome.problems)}\n{textwrap.indent(outcome.detail, '  ')}",
                      flush=True)
            elif report and len(outcomes) % 50 == 0:
                print(f"{len(outcomes)} runs", flush=True)
    return outcomes


def kinds_of(outcome: Outcome) -> set[str]:
    """What went wrong in a run, by kind: hang, lost future, orphan, status, output."""
    found = set()
    for problem in outcome.problems:
        found.add("hang" if problem.startswith(("hang", "never began"))
                  else "lost future" if "futures" in problem
                  else "orphan" if problem.startswith("orphans")
                  else "status" if problem.startswith("exit status")
                  else "output")
    return found


def table(outcomes: list[Outcome], python: str) -> str:
    """Runs, failures by kind and the slowest exit, per path and start method."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True).stdout.strip()
    rows = collections.defaultdict(list)
    for outcome in outcomes:
        rows[outcome.path, outcome.method].append(outcome)
    kinds = ("hang", "lost future", "orphan", "status", "output")
    lines = [f"Python {version}: {len(outcomes)} runs, "
             f"{sum(1 for o in outcomes if o.problems)} failed",
             "| path | method | runs | SIGINT/SIGTERM/SIGKILL | ended first | " + " | ".join(
                 kind + ("es" if kind == "status" else "s") for kind in kinds) + " | slowest exit, s |",
             "|---|---|---|---|---|" + "---|" * len(kinds) + "---|"]
    for (path, method), group in sorted(rows.items()):
        signals = collections.Counter(o.signal for o in group)
        found = collections.Counter(kind for o in group for kind in kinds_of(o))
        times = [o.seconds_to_exit for o in group
                 if o.seconds_to_exit is not None and not o.ended_first]
        slowest = f"{max(times):.2f}" if times else "-"
        lines.append(f"| {path} | {method} | {len(group)} | {signals['SIGINT']}/"
                     f"{signals['SIGTERM']}/{signals['SIGKILL']} | "
                     f"{sum(1 for o in group if o.ended_first)} | "
                     + " | ".join(str(found[kind]) for kind in kinds) + f" | {slowest} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--methods", default=",".join(START_METHODS))
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"of {', '.join(PATHS + ('dask',))}")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--busy", type=int, default=2 * (os.cpu_count() or 1),
                        help="spinning processes beside the runs")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--signals", default=",".join(SIGNALS),
                        help="the signals runs may get (default: all three)")
    parser.add_argument("--replay", metavar="PATH:METHOD:SEED",
                        help="run once more a run that failed (as FAILED names it)")
    args = parser.parse_args()
    if args.replay:
        path, method, seed = args.replay.split(":")
        with Busy(args.busy):
            outcome = run_once(path, method, int(seed), args.python)
        print(outcome.problems or "passed", outcome.detail, sep="\n")
        return 1 if outcome.problems else 0
    unknown = set(args.signals.split(",")) - set(SIGNALS)
    if unknown:
        parser.error(f"--signals: {', '.join(sorted(unknown))} is not one of {', '.join(SIGNALS)}")
    _signals.intersection_update(args.signals.split(","))
    methods = args.methods.split(",")
    paths = args.paths.split(",")
    print(f"shake: {args.runs} runs, seed {args.seed}, {args.busy} busy processes, "
          f"{args.jobs} at once, {args.python}", flush=True)
    started = time.monotonic()
    with Busy(args.busy):
        outcomes = shake(args.runs, methods, paths, args.seed, args.jobs, args.python)
    print(table(outcomes, args.python))
    print(f"({time.monotonic() - started:.0f} s)")
    return 1 if any(o.problems for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

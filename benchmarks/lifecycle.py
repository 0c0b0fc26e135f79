"""How fast pool ends things: timeouts, stop(), terminate/kill, crash recovery, shutdown.

Usage: python benchmarks/lifecycle.py [--rounds N] [--start-method M ...]

Prints, per start method, the median (and min-max) over N rounds of:
- timeout overshoot: how long after a task's timeout expired its future failed (the task
  is stuck in C code holding the GIL, so the parent must dump its stack and kill it);
- stop(): from the call to the future being cancelled and its worker gone;
- terminate_workers() / kill_workers(): how long the call takes with two busy workers whose
  tasks each started a subprocess (it returns once everything is confirmed gone);
- terminate_workers() when the tasks ignore SIGTERM (bounded by terminate_grace=0.5);
- crash -> next result: from SIGKILLing the only worker to the next task's result;
- shutdown(): an idle pool of two workers, from the call to its return.
Stdlib only (plus pool). Figures are wall-clock on this machine; read them as orders of
magnitude, not as assertions.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import pool  # noqa: E402
import tasks  # noqa: E402  (the test suite's task functions: importable by every worker)


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("scenario did not start")
        time.sleep(0.001)


def timeout_overshoot(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        p.submit(tasks.square, 1).result()
        with tempfile.TemporaryDirectory() as pid_dir:
            future = p.schedule(tasks.stuck_in_c_holding_the_gil, (pid_dir,), timeout=0.5)
            _wait_for(lambda: tasks.announced_pids(pid_dir))
            started = time.monotonic()
            future.exception()
            return time.monotonic() - started - 0.5


def stop_running(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p, tempfile.TemporaryDirectory() as pid_dir:
        future = p.submit(tasks.hang, pid_dir)
        _wait_for(lambda: tasks.announced_pids(pid_dir))
        started = time.monotonic()
        future.stop()
        _wait_for(future.cancelled)
        return time.monotonic() - started


def end_workers(ctx, how, ignore_sigterm=False):
    with tempfile.TemporaryDirectory() as pid_dir:
        p = pool.ProcessPool(2, mp_context=ctx, terminate_grace=0.5)
        for _ in range(2):
            p.submit(tasks.start_subprocess_then_hang, pid_dir, ignore_sigterm)
        _wait_for(lambda: len(tasks.announced_pids(pid_dir)) == 2)
        started = time.monotonic()
        getattr(p, how)()
        return time.monotonic() - started


def crash_to_next_result(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        pid = p.submit(tasks.pid_of_worker).result()
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        p.submit(tasks.square, 2).result()
        return time.monotonic() - started


def idle_shutdown(ctx):
    p = pool.ProcessPool(2, mp_context=ctx)
    list(p.map(tasks.sleep_then, [0.2, 0.2]))  # both workers up
    started = time.monotonic()
    p.shutdown()
    return time.monotonic() - started


MEASURES = [
    ("timeout overshoot", timeout_overshoot),
    ("stop() a running task", stop_running),
    ("terminate_workers()", lambda ctx: end_workers(ctx, "terminate_workers")),
    ("kill_workers()", lambda ctx: end_workers(ctx, "kill_workers")),
    ("terminate, SIGTERM ignored", lambda ctx: end_workers(ctx, "terminate_workers", True)),
    ("crash -> next result", crash_to_next_result),
    ("idle shutdown()", idle_shutdown),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--start-method", action="append", dest="methods",
                        choices=multiprocessing.get_all_start_methods())
    args = parser.parse_args()
    methods = args.methods or ["fork", "forkserver", "spawn"]
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.rounds} rounds; "
          f"median (min-max), milliseconds")
    print(f"{'':28}" + "".join(f"{m:>22}" for m in methods))
    for name, measure in MEASURES:
        row = f"{name:28}"
        for method in methods:
            ctx = multiprocessing.get_context(method)
            times = [measure(ctx) * 1000 for _ in range(args.rounds)]
            row += f"{statistics.median(times):>9.1f} ({min(times):.0f}-{max(times):.0f})".rjust(22)
        print(row, flush=True)


if __name__ == "__main__":
    main()

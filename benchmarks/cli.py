"""``python -m pool map`` side by side with ``xargs -P`` and GNU ``parallel``.

Usage::

    python benchmarks/cli.py [--inputs 200] [--workers 2] [--rounds 3] [--work-ms 0 5]

The job: call a Python function on each input (the lines of ``seq 1 N``) and collect one
output line per input. ``xargs -P W -n 1`` and ``parallel -k -j W`` start an interpreter per
input (that is how they run Python code); ``pool map`` starts W workers once. Each tool
runs the same inputs in the same round, the order rotating from round to round, so a noisy
machine hurts them alike; the table gives the median wall time over the rounds, min-max,
and the ratio to ``pool map`` (above 1: slower than pool). ``--work-ms`` sets how long the
function computes per input (0: the per-input overhead alone). Every tool's output is
checked (N lines, the right results) before its time counts. GNU parallel is skipped
when it is not installed. Stdlib only; nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TASK = '''\
import sys, time

def work(text):
    """Busy for WORK_MS milliseconds, then the input's square."""
    deadline = time.perf_counter() + {work_ms} / 1000
    while time.perf_counter() < deadline:
        pass
    return int(text) ** 2

if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(work(argument))
'''


def _tools(task_dir: str, workers: int) -> dict[str, list[str]]:
    script = os.path.join(task_dir, "bench_task.py")
    tools = {
        "pool map": [sys.executable, "-m", "pool", "map", "-j", str(workers),
                     f"{script}:work"],
        "xargs -P": ["xargs", "-P", str(workers), "-n", "1", sys.executable, script],
    }
    if shutil.which("parallel"):
        tools["GNU parallel"] = ["parallel", "-k", "-j", str(workers), sys.executable, script,
                                 "{}"]
    return tools


def _run(command: list[str], inputs: bytes, expected: list[int], ordered: bool) -> float:
    start = time.perf_counter()
    # PYTHONUNBUFFERED would make each print two writes, which xargs -P's concurrent
    # processes then interleave mid-line.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run(command, input=inputs, capture_output=True, timeout=600, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({proc.returncode}): {proc.stderr.decode()}")
    got = [int(line) for line in proc.stdout.split()]
    if (got if ordered else sorted(got)) != expected:
        raise SystemExit(f"{' '.join(command)} printed wrong results")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-ms", type=float, nargs="+", default=[0.0, 5.0])
    options = parser.parse_args()
    inputs = "".join(f"{i}\n" for i in range(1, options.inputs + 1)).encode()
    expected = [i * i for i in range(1, options.inputs + 1)]
    print(f"{options.inputs} inputs, {options.workers} workers, {options.rounds} rounds, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    for work_ms in options.work_ms:
        with tempfile.TemporaryDirectory() as task_dir:
            with open(os.path.join(task_dir, "bench_task.py"), "w") as f:
                f.write(TASK.format(work_ms=work_ms))
            tools = _tools(task_dir, options.workers)
            times: dict[str, list[float]] = {name: [] for name in tools}
            names = list(tools)
            for round_ in range(options.rounds):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    # pool map and parallel -k keep input order; xargs -P does not.
                    times[name].append(_run(tools[name], inputs, expected,
                                            ordered=name != "xargs -P"))
        base = statistics.median(times["pool map"])
        print(f"\nwork per input: {work_ms:g} ms")
        print(f"  {'tool':<14} {'median s':>9} {'min-max s':>15} {'vs pool map':>12}")
        for name in names:
            median = statistics.median(times[name])
            print(f"  {name:<14} {median:>9.3f} {min(times[name]):>7.3f}-{max(times[name]):<7.3f}"
                  f" {median / base:>11.1f}x")
    if not shutil.which("parallel"):
        print("\n(GNU parallel is not installed: not compared)")


if __name__ == "__main__":
    main()

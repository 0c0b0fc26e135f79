"""Two checkouts of pool side by side: the same workloads on each, interleaved A, B, A, B.

Usage::

    python benchmarks/ab.py BEFORE_TREE AFTER_TREE [--rounds 6] [--tasks 10000]

For a change that should not change speed (a refactor), or one that should: each round
runs one child interpreter per tree (the tree first on ``sys.path``), in alternating order,
so that a machine that gets busier or quieter mid-run hurts both alike. It prints, per
workload, the median over the rounds for each tree, min-max, and after/before. Nothing is
asserted. ``compare.py`` compares pool with other pools; this compares pool with itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# Run in the child, with the tree under test first on sys.path.
_CHILD = r'''
import json, multiprocessing, os, sys, time
import pool

def noop(x=None):
    return x

def main(tasks):
    ctx = multiprocessing.get_context("forkserver")
    out = {"pool": os.path.dirname(pool.__file__)}
    start = time.perf_counter()
    with pool.ProcessPool(2, mp_context=ctx) as p:
        p.submit(noop).result()
        out["start -> first result, ms"] = (time.perf_counter() - start) * 1e3
        started = time.perf_counter()
        for f in [p.submit(noop, i) for i in range(tasks)]:
            f.result()
        out["submit+collect, tasks/s"] = tasks / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in p.map(noop, range(tasks)):
            pass
        out["map chunksize=1, tasks/s"] = tasks / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in p.map(noop, range(tasks * 20), chunksize=1000):
            pass
        out["map chunksize=1000, items/s"] = tasks * 20 / (time.perf_counter() - started)
        latencies = []
        for i in range(min(tasks, 2000)):
            t = time.perf_counter()
            p.submit(noop, i).result()
            latencies.append(time.perf_counter() - t)
        latencies.sort()
        out["sequential p50, us"] = latencies[len(latencies) // 2] * 1e6
        blob = b"x" * (64 << 20)
        started = time.perf_counter()
        p.submit(noop, blob).result()
        out["64 MiB there and back, MB/s"] = 2 * len(blob) / (time.perf_counter() - started) / 1e6
    print(json.dumps(out))

if __name__ == "__main__":
    main(int(sys.argv[1]))
'''

def run_tree(tree: str, script: str, tasks: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    proc = subprocess.run([sys.executable, script, str(tasks)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=os.path.abspath(tree))
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: exit {proc.returncode}\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if os.path.realpath(result.pop("pool")) != os.path.realpath(os.path.join(tree, "pool")):
        raise SystemExit(f"{tree}: the child imported another pool")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=10_000)
    args = parser.parse_args()
    if os.path.realpath(args.before) == os.path.realpath(args.after):
        parser.error("BEFORE_TREE and AFTER_TREE are the same tree")
    results: dict[str, list[dict[str, float]]] = {args.before: [], args.after: []}
    with tempfile.TemporaryDirectory() as folder:
        # A file, not -c: workers started by forkserver import the main module's functions.
        script = os.path.join(folder, "ab_child.py")
        with open(script, "w") as out:
            out.write(_CHILD)
        for round_number in range(args.rounds):
            order = [args.before, args.after][:: 1 if round_number % 2 == 0 else -1]
            for tree in order:
                results[tree].append(run_tree(tree, script, args.tasks))
    import multiprocessing
    from machine import pipe_ping_pong   # (benchmarks/ is this script's sys.path[0])
    ping = pipe_ping_pong(multiprocessing.get_context("forkserver"))
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, forkserver, 2 workers, "
          f"{args.rounds} rounds interleaved; median (min-max). The machine, after: "
          f"multiprocessing.Pipe ping-pong {ping * 1e6:.0f} us")
    print(f"  {'':34}{'before':>34}{'after':>34}  after/before")
    for key in results[args.before][0]:
        cells = []
        medians = []
        for tree in (args.before, args.after):
            values = [r[key] for r in results[tree]]
            medians.append(statistics.median(values))
            cells.append(f"{medians[-1]:,.1f} ({min(values):,.1f}-{max(values):,.1f})")
        print(f"  {key:34}{cells[0]:>34}{cells[1]:>34}  {medians[1] / medians[0]:.2f}x")


if __name__ == "__main__":
    main()

"""A short script's start: from a fresh interpreter to its first result, pool against the
stdlib's ``ProcessPoolExecutor``, on each start method.

Usage::

    python benchmarks/startup.py [--runs 15] [--methods forkserver,spawn,fork]

Each run is a new interpreter (so nothing is imported or started yet, the forkserver
included) running a script that imports the pool, makes one with 2 workers, and waits for
one no-op task's result. Two times are taken: inside the script, from its first line to
the result (imports, the pool's start, the forkserver's start and the first worker's),
and outside, the whole process from ``fork`` to exit (interpreter start and shutdown
too). Runs alternate between the pools. pool's modules are compiled first
(``compileall``), as an installation from a wheel has them; with
``PYTHONDONTWRITEBYTECODE`` set and an editable install, every start would compile them.

Stdlib only. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

SCRIPT = '''
import time
started = time.perf_counter()
import sys
sys.path.insert(0, {root!r})
import multiprocessing


def noop(x=None):
    return x


if __name__ == "__main__":
    if {kind!r} == "pool":
        import pool
        executor = pool.ProcessPool(2, mp_context=multiprocessing.get_context({method!r}))
    else:
        import concurrent.futures
        executor = concurrent.futures.ProcessPoolExecutor(
            2, mp_context=multiprocessing.get_context({method!r}))
    executor.submit(noop, 1).result()
    print(time.perf_counter() - started)
    executor.shutdown()
'''


def one_run(kind: str, method: str, directory: str) -> tuple[float, float]:
    path = os.path.join(directory, f"start_{kind}_{method}.py")
    with open(path, "w") as f:
        f.write(SCRIPT.format(root=os.path.abspath(ROOT), kind=kind, method=method))
    started = time.perf_counter()
    out = subprocess.run([sys.executable, path], capture_output=True, text=True, check=True,
                         cwd=directory, timeout=60).stdout
    return float(out.split()[-1]), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--methods", default="forkserver,spawn,fork")
    args = parser.parse_args()
    compileall.compile_dir(os.path.join(ROOT, "pool"), quiet=1)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.runs} runs each, "
          f"median (min-max) in ms, and pool's ratio to the stdlib (lower is better)")
    with tempfile.TemporaryDirectory() as directory:
        for method in args.methods.split(","):
            times: dict[str, list[tuple[float, float]]] = {"pool": [], "stdlib": []}
            for run in range(args.runs):
                for kind in (("pool", "stdlib") if run % 2 else ("stdlib", "pool")):
                    times[kind].append(one_run(kind, method, directory))
            for index, label in ((0, "script start -> first result"),
                                 (1, "whole process")):
                cells = []
                for kind in ("pool", "stdlib"):
                    values = [t[index] * 1000 for t in times[kind]]
                    cells.append(f"{kind} {statistics.median(values):.1f} "
                                 f"({min(values):.1f}-{max(values):.1f})")
                ratio = (statistics.median(t[index] for t in times["pool"])
                         / statistics.median(t[index] for t in times["stdlib"]))
                print(f"  {method:10} {label:30} {cells[0]:28} {cells[1]:28} {ratio:.2f}x")


if __name__ == "__main__":
    main()

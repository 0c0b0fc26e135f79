"""What seeing into the pool costs: ``stats()`` calls, and ``map(..., progress=)``.

Usage::

    python benchmarks/introspection.py [--workers 2] [--tasks 20000] [--rounds 3]

Measures, in one run, interleaved round by round:

- ``stats()`` calls per second on an idle pool, and while a ``map`` of tiny tasks runs in
  another thread (with that map's throughput, against the same map with nobody calling
  ``stats()``): what a monitoring loop costs the work;
- ``map`` of tiny tasks with ``progress=`` (a counter object) against the same ``map``
  without, with ``chunksize`` 1 and 100; and, where tqdm is installed, with a real tqdm bar
  writing to /dev/null.

Prints medians and ratios; nothing is asserted (the tests never time anything).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pool  # noqa: E402


def noop(x: Any = None) -> Any:
    return x


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int) -> None:
        self.n += n


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def stats_rate(p: pool.ProcessPool, seconds: float = 0.5) -> float:
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        p.stats()
        calls += 1
    return calls / seconds


def map_with_watcher(p: pool.ProcessPool, tasks: int) -> tuple[float, float]:
    """Tasks per second of a map while another thread calls stats() flat out, and that
    thread's calls per second."""
    done = threading.Event()
    calls = [0]

    def watch() -> None:
        while not done.is_set():
            p.stats()
            calls[0] += 1

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.perf_counter()
    list(p.map(noop, range(tasks)))
    elapsed = time.perf_counter() - start
    done.set()
    watcher.join()
    return tasks / elapsed, calls[0] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    rows: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    with pool.ProcessPool(args.workers) as p:
        list(p.map(noop, range(100)))  # workers up
        for _ in range(args.rounds):
            record("stats() calls/s, idle pool", stats_rate(p))
            record("map tasks/s, nobody watching", args.tasks / timed(
                lambda: list(p.map(noop, range(args.tasks)))))
            rate, calls = map_with_watcher(p, args.tasks)
            record("map tasks/s, a thread calling stats() flat out", rate)
            record("stats() calls/s during that map", calls)
            for chunksize in (1, 100):
                record(f"map tasks/s chunksize {chunksize}, no progress", args.tasks / timed(
                    lambda: list(p.map(noop, range(args.tasks), chunksize=chunksize))))
                counter = Counter()
                record(f"map tasks/s chunksize {chunksize}, progress=counter",
                       args.tasks / timed(lambda: list(p.map(
                           noop, range(args.tasks), chunksize=chunksize, progress=counter))))
                assert counter.n == args.tasks
                if tqdm is not None:
                    with open(os.devnull, "w") as sink, tqdm(total=args.tasks, file=sink) as bar:
                        record(f"map tasks/s chunksize {chunksize}, progress=tqdm",
                               args.tasks / timed(lambda: list(p.map(
                                   noop, range(args.tasks), chunksize=chunksize,
                                   progress=bar))))
    print(f"python {sys.version.split()[0]}, {args.workers} workers, {args.tasks} tasks, "
          f"{args.rounds} rounds (median, min-max)")
    for name, values in rows.items():
        print(f"  {name:<52} {statistics.median(values):>10.0f}   "
              f"{min(values):.0f}-{max(values):.0f}")


if __name__ == "__main__":
    main()

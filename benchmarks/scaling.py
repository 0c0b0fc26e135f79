"""How pool's cost grows: with the number of workers, and with the number of tasks.

Usage::

    python benchmarks/scaling.py [--workers 2,8,32] [--tasks 1000,10000,100000,1000000]
                                 [--start-method forkserver] [--rounds 3] [--quick]

Measured side by side, in one run, round by round (the order rotates), for
``pool.ProcessPool``, the stdlib's ``ProcessPoolExecutor`` and ``multiprocessing.Pool`` (on
the same start method):

- throughput at each worker count: no-op tasks submitted and collected one by one, and
  ``map`` with the pool's own default chunks (an executor's is 1; ``multiprocessing.Pool``
  picks its own), in tasks/s;
- per idle worker: the parent's resident memory and open descriptors (their growth from
  no worker to all of them, divided by their number: a few KiB, so within the noise of
  the allocator), each worker's own resident memory, and the CPU the parent and its
  workers use while nothing runs (percent of one core);
- at 2 workers, no-op tasks/s for ``map`` of 1,000 up to 1,000,000 tasks (chunksize 1,
  the input read lazily where the pool can: ``buffersize``), and the parent's peak
  resident memory growth over the run. The stdlib's executor is measured up to 100,000
  (a million of its futures take minutes); ``--tasks`` changes the sizes.

The machine's ``multiprocessing.Pipe`` ping-pong is printed beside them: a busy machine
slows every row alike, which is why only the ratios in one run mean anything. Stdlib only
(plus the pools). Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import multiprocessing.pool
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pool  # noqa: E402
from compare import fmt, noop, worker_pid  # noqa: E402
from machine import pipe_ping_pong  # noqa: E402


def _rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Kind:
    """One pool type: how to start it, run many tasks, and list its workers."""

    def __init__(self, name: str, start: Callable[[int, Any], Any], lazy_map: bool) -> None:
        self.name, self._start, self.lazy_map = name, start, lazy_map

    def start(self, workers: int, ctx: Any) -> Any:
        return self._start(workers, ctx)

    def submit_all(self, p: Any, n: int) -> None:
        if isinstance(p, multiprocessing.pool.Pool):
            for r in [p.apply_async(noop, (i,)) for i in range(n)]:
                r.get()
        else:
            for f in [p.submit(noop, i) for i in range(n)]:
                f.result()

    def map(self, p: Any, n: int, chunksize: int | None) -> None:
        if isinstance(p, multiprocessing.pool.Pool):
            for _ in p.imap(noop, range(n), **({} if chunksize is None else
                                                {"chunksize": chunksize})):
                pass
        else:
            extra: dict[str, Any] = {} if chunksize is None else {"chunksize": chunksize}
            if self.lazy_map:
                extra["buffersize"] = 4096
            for _ in p.map(noop, range(n), **extra):
                pass

    def workers(self, p: Any, count: int) -> set[int]:
        if isinstance(p, multiprocessing.pool.Pool):
            return set(p.map(worker_pid, range(count * 20), chunksize=1))
        return set(p.map(worker_pid, range(count * 20)))

    def stop(self, p: Any) -> None:
        if isinstance(p, multiprocessing.pool.Pool):
            p.close()
            p.join()
        else:
            p.shutdown(wait=True)


KINDS = [
    Kind("pool", lambda w, ctx: pool.ProcessPool(w, mp_context=ctx), lazy_map=True),
    Kind("stdlib", lambda w, ctx: cf.ProcessPoolExecutor(w, mp_context=ctx),
         lazy_map=sys.version_info >= (3, 14)),
    Kind("mp.Pool", lambda w, ctx: ctx.Pool(w), lazy_map=False),
]


def throughput(kind: Kind, workers: int, ctx: Any, tasks: int) -> dict[str, float]:
    p = kind.start(workers, ctx)
    try:
        kind.workers(p, workers)  # all up before timing
        started = time.perf_counter()
        kind.submit_all(p, tasks)
        submit_rate = tasks / (time.perf_counter() - started)
        started = time.perf_counter()
        kind.map(p, tasks, None)
        map_rate = tasks / (time.perf_counter() - started)
    finally:
        kind.stop(p)
    return {f"{workers} workers: submit+collect, tasks/s": submit_rate,
            f"{workers} workers: map default chunks, tasks/s": map_rate}


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def idle_cost(kind: Kind, workers: int, ctx: Any, seconds: float = 2.0) -> dict[str, float]:
    before, descriptors = _rss(), _descriptors()
    p = kind.start(workers, ctx)
    try:
        pids = kind.workers(p, workers)
        time.sleep(0.3)
        parent = (_rss() - before) / workers
        parent_fds = (_descriptors() - descriptors) / workers
        worker = statistics.mean(_rss(pid) for pid in pids)
        cpu0 = time.process_time() + sum(_cpu_seconds(pid) for pid in pids)
        time.sleep(seconds)
        cpu1 = time.process_time() + sum(_cpu_seconds(pid) for pid in pids)
    finally:
        kind.stop(p)
    return {f"{workers} workers: parent KiB per worker": parent / 1024,
            f"{workers} workers: parent descriptors per worker": parent_fds,
            f"{workers} workers: worker RSS, MiB": worker / 2**20,
            f"{workers} workers: idle CPU, % of a core": 100 * (cpu1 - cpu0) / seconds}


def by_task_count(kind: Kind, ctx: Any, tasks: int) -> dict[str, float]:
    p = kind.start(2, ctx)
    try:
        kind.workers(p, 2)
        before = _rss()
        started = time.perf_counter()
        kind.map(p, tasks, 1)
        rate = tasks / (time.perf_counter() - started)
        grown = (_rss() - before) / 2**20
    finally:
        kind.stop(p)
    return {f"map of {tasks:,}, tasks/s": rate, f"map of {tasks:,}, parent growth MiB": grown}


def report(title: str, results: dict[str, dict[str, list[float]]]) -> None:
    print(f"\n{title}")
    names = list(results)
    metrics: list[str] = []
    for per_kind in results.values():
        metrics += [m for m in per_kind if m not in metrics]
    print(f"  {'':46}" + "".join(f"{n:>26}" for n in names))
    for metric in metrics:
        row = f"  {metric:46}"
        base = results.get("stdlib", {}).get(metric)
        for name in names:
            values = results[name].get(metric)
            if not values:
                row += f"{'n/a':>26}"
                continue
            cell = f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"
            if base and name != "stdlib" and statistics.median(base):
                cell += f" {statistics.median(values) / statistics.median(base):.2f}x"
            row += f"{cell:>26}"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,8,32")
    parser.add_argument("--tasks", default="1000,10000,100000,1000000")
    parser.add_argument("--stdlib-up-to", type=int, default=100_000)
    parser.add_argument("--start-method", default="forkserver",
                        choices=multiprocessing.get_all_start_methods())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    task_counts = [int(t) for t in args.tasks.split(",")]
    if args.quick:
        args.rounds, task_counts = 1, [t for t in task_counts if t <= 10_000]
    ctx = multiprocessing.get_context(args.start_method)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, start method "
          f"{args.start_method}, {args.rounds} rounds; median (min-max), ratio to the stdlib")
    ping = statistics.median(pipe_ping_pong(ctx) for _ in range(3))
    print(f"The machine: multiprocessing.Pipe ping-pong {fmt(ping * 1e6)} us round trip")

    rates: dict[str, dict[str, list[float]]] = {k.name: {} for k in KINDS}
    idle: dict[str, dict[str, list[float]]] = {k.name: {} for k in KINDS}
    counts: dict[str, dict[str, list[float]]] = {k.name: {} for k in KINDS}
    for round_number in range(args.rounds):
        order = KINDS[round_number % len(KINDS):] + KINDS[:round_number % len(KINDS)]
        for kind in order:
            for workers in worker_counts:
                for metric, value in throughput(kind, workers, ctx, 5_000 if args.quick
                                                else 20_000).items():
                    rates[kind.name].setdefault(metric, []).append(value)
                for metric, value in idle_cost(kind, workers, ctx).items():
                    idle[kind.name].setdefault(metric, []).append(value)
            for tasks in task_counts:
                if kind.name == "stdlib" and tasks > args.stdlib_up_to:
                    continue
                for metric, value in by_task_count(kind, ctx, tasks).items():
                    counts[kind.name].setdefault(metric, []).append(value)
    report("Throughput by worker count (higher is better)", rates)
    report("Each idle worker (lower is better)", idle)
    report("By number of tasks, 2 workers, map chunksize 1", counts)


if __name__ == "__main__":
    main()

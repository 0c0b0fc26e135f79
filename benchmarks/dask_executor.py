"""dask.distributed workers with their default thread executor vs. pool.dask's plugin.

Usage: python benchmarks/dask_executor.py [--rounds N] [--workers W] [--small N] [--busy N]

Needs ``pip install 'sturdypool[dask]'``. Each round starts a ``LocalCluster`` of one dask worker
process (with its nanny) per executor, interleaved, and measures:

- throughput of tiny tasks (``client.map`` of a no-op) and of ~10 ms CPU-bound tasks
  (a pure-Python loop: threads share one GIL, processes do not);
- recovery after a task that kills its process (SIGSEGV) while bystander tasks (1 s each)
  run next to it: the time from the crash until the cluster completes a task submitted at
  that moment (resubmitted while it fails), how many bystanders and later tasks failed, and
  what the killer's future raised.

Prints medians (and min-max) over the rounds, with ratios pool/threads. Figures are wall
clock on a shared machine: compare the columns of one run, not runs with each other.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client, LocalCluster

from pool.dask import ProcessPoolPlugin

EXECUTORS = ("threads", "pool")


def noop(i):
    return i


def busy(i, seconds=0.010):
    """About ``seconds`` of pure-Python CPU work (holds the GIL all along)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return i


def bystander(directory):
    Path(directory, f"bystander-{os.getpid()}-{time.monotonic_ns()}").write_text("")
    time.sleep(1.0)
    return "ok"


def killer(directory, needed):
    deadline = time.monotonic() + 30
    while len([p for p in os.listdir(directory) if p.startswith("bystander")]) < needed:
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    Path(directory, f"crash-{time.time()!r}").write_text("")
    ctypes.string_at(0)


def cluster(executor, workers):
    c = LocalCluster(n_workers=1, threads_per_worker=workers, processes=True,
                     host="127.0.0.1", dashboard_address=None)
    client = Client(c)
    if executor == "pool":
        client.register_plugin(ProcessPoolPlugin(max_workers=workers))
    client.submit(noop, 0, pure=False).result()  # warm: the pool's processes are up
    client.gather(client.map(noop, range(workers * 4), pure=False))
    return c, client


def throughput(client, fn, count):
    started = time.perf_counter()
    client.gather(client.map(fn, range(count), pure=False))
    return count / (time.perf_counter() - started)


def recovery(client, workers):
    """(seconds from the crash to the first result of a task submitted after it,
    bystanders failed, tasks submitted after the crash that failed, the killer's error)."""
    with tempfile.TemporaryDirectory() as directory:
        bystanders = [client.submit(bystander, directory, pure=False)
                      for _ in range(workers - 1)]
        killing = client.submit(killer, directory, workers - 1, pure=False)
        while not any(p.startswith("crash-") for p in os.listdir(directory)):
            time.sleep(0.001)
        crash_name = next(p for p in os.listdir(directory) if p.startswith("crash-"))
        crashed_at = float(crash_name[len("crash-"):])
        lost = 0  # tasks submitted after the crash that failed (they may land on a
        while True:  # worker that the retried killer takes down again)
            try:
                client.submit(noop, 1, pure=False).result(timeout=300)
                break
            except Exception:
                lost += 1
        recovered = time.time() - crashed_at
        failed = 0
        for b in bystanders:
            try:
                b.result(timeout=300)
            except Exception:
                failed += 1
        try:
            killing.result(timeout=300)
            error = "none"
        except Exception as exc:
            error = type(exc).__name__
    return recovered, failed, lost, error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4,
                        help="threads of the dask worker, and processes of its pool")
    parser.add_argument("--small", type=int, default=2000, help="tiny tasks per round")
    parser.add_argument("--busy", type=int, default=400, help="10 ms tasks per round")
    args = parser.parse_args()
    figures = {e: {"small": [], "busy": [], "recovery": [], "failed": [], "lost": [],
                   "error": []}
               for e in EXECUTORS}
    for round_ in range(args.rounds):
        order = EXECUTORS if round_ % 2 == 0 else EXECUTORS[::-1]
        for executor in order:
            c, client = cluster(executor, args.workers)
            try:
                f = figures[executor]
                f["small"].append(throughput(client, noop, args.small))
                f["busy"].append(throughput(client, busy, args.busy))
                recovered, failed, lost, error = recovery(client, args.workers)
                f["recovery"].append(recovered)
                f["failed"].append(failed)
                f["lost"].append(lost)
                f["error"].append(error)
            finally:
                client.close()
                c.close()
            print(f"round {round_ + 1}/{args.rounds}: {executor} done", file=sys.stderr,
                  flush=True)

    def cell(values, fmt):
        return (f"{fmt.format(statistics.median(values))} "
                f"({fmt.format(min(values))}-{fmt.format(max(values))})")

    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; one dask worker "
          f"(nanny, {args.workers} threads, or a pool of {args.workers} processes); "
          f"median (min-max) of {args.rounds} interleaved rounds")
    rows = [("tiny tasks, tasks/s", "small", "{:,.0f}"),
            ("10 ms CPU tasks, tasks/s", "busy", "{:,.1f}"),
            ("crash -> next result, s", "recovery", "{:.2f}")]
    print(f"  {'':30}{'threads (dask default)':>28}{'pool.dask':>28}{'pool/threads':>14}")
    for label, key, fmt in rows:
        t, p = figures["threads"][key], figures["pool"][key]
        ratio = statistics.median(p) / statistics.median(t)
        print(f"  {label:30}{cell(t, fmt):>28}{cell(p, fmt):>28}{ratio:>13.2f}x")
    for executor in EXECUTORS:
        f = figures[executor]
        print(f"  {executor}: per crash, bystanders failed {f['failed']} of "
              f"{args.workers - 1}, later tasks failed {f['lost']}; the killing task "
              f"raised {sorted(set(f['error']))}")


if __name__ == "__main__":
    main()

"""A soak: a pool under a random mix of everything that can happen to a task, for a while.

Usage: python benchmarks/soak.py [--seconds 600] [--workers 4] [--start-method M]
                                 [--seed N] [--json]

For the given time it keeps about 50 tasks in flight, each one of: a short task returning a
payload of random size (up to 4 MiB), one that raises, one that overruns its timeout, one
that starts a child process and sleeps; meanwhile it calls ``stop()`` on random tasks and
SIGKILLs random workers and random children of workers from outside. Every future gets a
done-callback that counts how often it resolved.

It prints the figures: tasks by outcome, worker deaths, futures lost (never resolved) and
doubled (resolved twice), and the parent's descriptors, threads, children and resident
memory at the start (after a warm-up) and at the end, after ``shutdown()``. Stdlib only
(plus pool); Linux (``/proc``) for the process facts. ``tests/test_soak.py`` runs it for a
few seconds and checks the figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

try:  # the installed pool (what the test suite checks), else this checkout's
    import pool
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import pool

IN_FLIGHT = 50
KINDS = ["ok"] * 6 + ["raise", "timeout", "child"]


def run(kind: str, size: int, seconds: float) -> bytes:
    """A task of the given kind (module level: every worker can import it)."""
    if kind == "raise":
        raise ValueError(f"raised on purpose ({size})")
    if kind == "child":
        child = subprocess.Popen(["sleep", "30"])  # in the worker's group: ends with it
        time.sleep(10 * seconds)  # (long enough to be found, and killed, now and then)
        child.kill()
        child.wait()
    elif kind == "timeout":
        time.sleep(10)  # far past its timeout
    else:
        time.sleep(seconds)
    return os.urandom(16) * (size // 16)


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] != b"Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def resident_mib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def helper_pids() -> set[int]:
    """multiprocessing's own helpers (the forkserver, the resource tracker): not pool's."""
    from multiprocessing import forkserver, resource_tracker
    return {pid for pid in (getattr(forkserver._forkserver, "_forkserver_pid", None),
                            getattr(resource_tracker._resource_tracker, "_pid", None))
            if pid is not None}


def facts() -> dict[str, int]:
    """This process's descriptors, threads, children (multiprocessing's helpers aside) and
    resident memory."""
    return {"descriptors": len(os.listdir("/proc/self/fd")),
            "threads": threading.active_count(),
            "children": len(set(children_of(os.getpid())) - helper_pids()),
            "rss_mib": resident_mib()}


class Ledger:
    """How each future resolved, counted by done-callbacks (which run once per future, if
    the pool keeps its promise)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: collections.Counter[int] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.submitted = 0

    def watch(self, number: int, future: Any) -> None:
        def resolved(f: Any) -> None:
            with self.lock:
                self.calls[number] += 1
                self.outcomes[outcome_of(f)] += 1
        future.add_done_callback(resolved)


def outcome_of(future: Any) -> str:
    if future.cancelled():
        return "cancelled"
    error = future.exception()
    return "result" if error is None else type(error).__name__


def killer(p: pool.ProcessPool, rng: random.Random, stop: threading.Event,
           counts: collections.Counter[str], seen: set[int]) -> None:
    """SIGKILLs, from outside, a random worker or a random child of a worker now and then."""
    while not stop.wait(rng.uniform(0.05, 0.4)):
        workers = [w.pid for w in p.stats().workers]
        seen.update(workers)
        for worker in workers:  # (and the processes tasks started: they must go too)
            seen.update(children_of(worker))
        if not workers:
            continue
        target, what = rng.choice(workers), "workers killed"
        if rng.random() < 0.5:
            grandchildren = children_of(target)
            if grandchildren:
                target, what = rng.choice(grandchildren), "children killed"
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            continue  # (gone already)
        counts[what] += 1  # (a worker already ending when killed is no second death)


def soak(seconds: float, workers: int, method: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ledger = Ledger()
    kills: collections.Counter[str] = collections.Counter()
    p = pool.ProcessPool(workers, mp_context=multiprocessing.get_context(method))
    # Warm up (workers started, modules imported) before the first snapshot.
    list(p.map(run, ["ok"] * workers, [0] * workers, [0.0] * workers))
    start_facts = facts()
    stop = threading.Event()
    # Every worker, and every process a task started, that the killer saw: none may be
    # left once shutdown() returns.
    seen: set[int] = {w.pid for w in p.stats().workers}
    killing = threading.Thread(target=killer, args=(p, rng, stop, kills, seen), daemon=True)
    killing.start()
    pending: list[Any] = []
    started = time.monotonic()
    stops = 0
    memory = []  # resident MiB at each tenth of the run
    while time.monotonic() - started < seconds:
        if (time.monotonic() - started) >= len(memory) * seconds / 10:
            memory.append(resident_mib())
        pending = [f for f in pending if not f.done()]
        while len(pending) < IN_FLIGHT:
            kind = rng.choice(KINDS)
            size = rng.choice([0, 100, 10_000, 1 << 20, 4 << 20])
            future = p.schedule(run, (kind, size, rng.uniform(0, 0.02)),
                                timeout=0.2 if kind == "timeout" else None)
            ledger.submitted += 1
            ledger.watch(ledger.submitted, future)
            pending.append(future)
        if rng.random() < 0.05:
            rng.choice(pending).stop()
            stops += 1
        time.sleep(0.005)
    stop.set()
    killing.join()
    for future in pending:  # let the last ones finish (each ends, or the soak fails)
        try:
            future.exception(120)
        except Exception:  # cancelled
            pass
    stats = p.stats()
    seen.update(w.pid for w in stats.workers)
    p.shutdown()
    end_facts = facts()
    end_facts["workers_left"] = sum(1 for pid in seen if alive(pid))
    with ledger.lock:
        lost = ledger.submitted - len(ledger.calls)
        doubled = sum(1 for n in ledger.calls.values() if n > 1)
        outcomes = dict(ledger.outcomes)
    return {"seconds": round(time.monotonic() - started, 1), "start_method": method,
            "workers": workers, "submitted": ledger.submitted, "outcomes": outcomes,
            "lost": lost, "doubled": doubled, "stop_calls": stops, **dict(kills),
            "worker_deaths": stats.worker_deaths, "deaths_by_cause": stats.deaths_by_cause,
            "rss_mib_by_tenth": memory, "worker_pids": len(seen), "start": start_facts,
            "end": end_facts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--start-method", default="forkserver")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON line, for tests")
    args = parser.parse_args()
    # Every death is one WARNING on the pool logger; here they are the point, not news.
    logging.getLogger("pool").setLevel(logging.ERROR)
    figures = soak(args.seconds, args.workers, args.start_method, args.seed)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"soak: {figures['seconds']} s, {figures['workers']} workers, "
          f"{figures['start_method']}")
    print(f"  tasks: {figures['submitted']} submitted; "
          + ", ".join(f"{n} {k}" for k, n in sorted(figures["outcomes"].items())))
    print(f"  futures lost: {figures['lost']}, resolved twice: {figures['doubled']}")
    print(f"  stop() calls: {figures['stop_calls']}; from outside: "
          f"{figures.get('workers killed', 0)} workers and "
          f"{figures.get('children killed', 0)} children of workers SIGKILLed")
    print(f"  worker deaths: {figures['worker_deaths']} {figures['deaths_by_cause']}; "
          f"of the {figures['worker_pids']} processes seen (workers and the children their "
          f"tasks started), {figures['end']['workers_left']} left after shutdown")
    for name in ("descriptors", "threads", "children"):
        print(f"  {name}: {figures['start'][name]} at the start, "
              f"{figures['end'][name]} at the end (after shutdown)")
    print(f"  resident MiB at each tenth of the run: {figures['rss_mib_by_tenth']}")


if __name__ == "__main__":
    main()

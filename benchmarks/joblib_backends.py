"""joblib's ``Parallel`` on loky (its default backend) and on pool (``pool.joblib``), side by
side in one process: tiny calls, 10 ms calls, 64 MiB arrays, and a crash.

Usage::

    python benchmarks/joblib_backends.py [--rounds 3] [--jobs 2]

Rows (each backend's workers warm, rounds interleaved; medians; "ratio" is loky's time over
pool's, so above 1 means pool is faster):

- tiny: 20,000 calls that return their argument (``batch_size="auto"``);
- 10 ms: 200 calls that each keep a CPU busy for 10 ms (2 s of work on 2 workers is 1 s);
- 64 MiB in: 8 calls, each given its own 64 MiB float64 array, returning its sum (loky
  memory-maps the arrays: joblib's ``max_nbytes``, default 1M);
- 64 MiB there and back: 4 calls, each given a 64 MiB array and returning ``a + 1``;
- a crash: 20 calls of 50 ms, the 11th of which segfaults as it starts, with
  ``return_as="generator_unordered"``; then a ``Parallel`` of 10 tiny calls. Shown: what was
  raised, how many results were delivered before it, the time until it was raised and the
  time the next call took (loky restarts its executor; pool refilled one slot).

Needs joblib and numpy (``pip install 'sturdypool[joblib]' numpy``). Nothing here is
asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402

import pool.joblib  # noqa: E402,F401  (registers the backend "pool")
from machine import pipe_ping_pong  # noqa: E402

BACKENDS = ("loky", "pool")
MIB = 1 << 20


def identity(x: Any) -> Any:
    return x


def busy(seconds: float) -> float:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return seconds


def total(a: Any) -> float:
    return float(a.sum())


def plus_one(a: Any) -> Any:
    return a + 1


def work_or_die(i: int, bad: int) -> int:
    if i == bad:
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(0.05)
    return i


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rows(jobs: int) -> dict[str, Callable[[str], Any]]:
    arrays = [np.full(64 * MIB // 8, float(i)) for i in range(8)]

    def run(backend: str, calls: Any, **options: Any) -> list[Any]:
        return Parallel(n_jobs=jobs, backend=backend, **options)(calls)

    return {
        "tiny (20,000 calls)": lambda b: run(b, (delayed(identity)(i) for i in range(20_000))),
        "10 ms (200 calls)": lambda b: run(b, (delayed(busy)(0.01) for _ in range(200))),
        "64 MiB in (8 arrays)": lambda b: run(b, (delayed(total)(a) for a in arrays)),
        "64 MiB there and back (4)": lambda b: run(b, (delayed(plus_one)(a)
                                                      for a in arrays[:4])),
    }


def crash(backend: str, jobs: int) -> tuple[str, int, float, float]:
    calls = [delayed(work_or_die)(i, 10) for i in range(20)]
    delivered = 0
    raised = "nothing"
    started = time.perf_counter()
    try:
        for _ in Parallel(n_jobs=jobs, backend=backend,
                          return_as="generator_unordered")(calls):
            delivered += 1
    except Exception as error:  # what each backend raises is the point
        raised = type(error).__name__
    until_raised = time.perf_counter() - started
    next_call = timed(lambda: Parallel(n_jobs=jobs, backend=backend)(
        delayed(identity)(i) for i in range(10)))
    return raised, delivered, until_raised, next_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    table = rows(args.jobs)
    for backend in BACKENDS:  # warm: workers started, modules imported
        table["tiny (20,000 calls)"](backend)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, row in table.items():
            for backend in BACKENDS:
                times.setdefault((name, backend), []).append(timed(lambda: row(backend)))
    ping = pipe_ping_pong(multiprocessing.get_context("forkserver"))
    print(f"joblib Parallel, n_jobs={args.jobs}, {args.rounds} rounds, Python "
          f"{sys.version.split()[0]}; the machine: multiprocessing.Pipe ping-pong "
          f"{ping * 1e6:.0f} us")
    print(f"{'row':<28}{'loky (s)':>10}{'pool (s)':>10}{'ratio':>8}")
    for name in table:
        loky, ours = (statistics.median(times[(name, b)]) for b in BACKENDS)
        print(f"{name:<28}{loky:>10.3f}{ours:>10.3f}{loky / ours:>7.2f}x")
    print("\na crash (20 calls of 50 ms, the 11th segfaults; then 10 tiny calls):")
    for backend in BACKENDS:
        raised, delivered, until, next_call = crash(backend, args.jobs)
        print(f"  {backend:<5} raised {raised} after {until:.2f} s, with {delivered} of 19 "
              f"results delivered first; the next Parallel took {next_call:.3f} s")


if __name__ == "__main__":
    main()

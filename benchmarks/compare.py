"""pool side by side with concurrent.futures.ProcessPoolExecutor (and other pools).

Usage::

    python benchmarks/compare.py [--workers 2] [--start-method forkserver] [--rounds 3]
                                 [--tasks 20000] [--memory-tasks 1000000] [--quick]

Every pool runs the same workloads with the same start method (``multiprocessing.Pool``:
its default) and worker count, in one run, interleaved round by round (the order rotates),
so a noisy machine hurts them alike. For each workload it prints the median over the
rounds, min-max, and the ratio to the stdlib (higher is better for rates, lower for times).
It also measures what the machine allows in the same run: a raw ``multiprocessing.Pipe``
ping-pong between two processes and one-way ``os.pipe`` bandwidth. Compared:
``pool.ProcessPool``, ``ProcessPoolExecutor``, ``multiprocessing.Pool`` and ``pool.Pool``
(whose ratios are to ``multiprocessing.Pool``'s, marked ``mp``); loky as well when it is
installed.

Stdlib only (plus the pools themselves; with numpy installed, a row for an array). Nothing
here is asserted; the test suite never times anything.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import multiprocessing
import multiprocessing.pool
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pool  # noqa: E402
from machine import pipe_ping_pong  # noqa: E402

# --- task functions (module level: every worker can import them) --------------------------


def noop(x: Any = None) -> Any:
    return x


def identity(x: Any) -> Any:
    return x


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def worker_pid(_: Any = None) -> int:
    return os.getpid()


# --- adapters: one interface over every pool ----------------------------------------------

class Adapter:
    name = ""

    def __init__(self, workers: int, ctx: Any) -> None:
        self.workers, self.ctx = workers, ctx

    def start(self) -> Any:
        raise NotImplementedError

    def submit_all(self, p: Any, fn: Callable[..., Any], items: list[Any]) -> list[Any]:
        return [f.result() for f in [p.submit(fn, x) for x in items]]

    def call(self, p: Any, fn: Callable[..., Any], x: Any, timeout: float | None = None) -> Any:
        return p.submit(fn, x).result(timeout)

    def abandon(self, p: Any) -> None:
        """End a pool that may be broken or hung, without waiting for it."""
        p.shutdown(wait=False, cancel_futures=True)
        for process in list((getattr(p, "_processes", None) or {}).values()):
            process.kill()

    def map(self, p: Any, fn: Callable[..., Any], items: Any, chunksize: int) -> list[Any]:
        return list(p.map(fn, items, chunksize=chunksize))

    def map_default(self, p: Any, fn: Callable[..., Any], items: Any) -> list[Any]:
        """``map`` as its users call it most: its own default chunks (an executor's: 1)."""
        return list(p.map(fn, items))

    def stop(self, p: Any) -> None:
        p.shutdown(wait=True)

    def worker_pids(self, p: Any) -> set[int]:
        return set(self.map(p, worker_pid, range(self.workers * 20), 1))


class PoolAdapter(Adapter):
    name = "pool"

    def start(self) -> Any:
        return pool.ProcessPool(self.workers, mp_context=self.ctx)


class StdlibAdapter(Adapter):
    name = "stdlib"

    def start(self) -> Any:
        return cf.ProcessPoolExecutor(self.workers, mp_context=self.ctx)


class MultiprocessingPoolAdapter(Adapter):
    """``multiprocessing.Pool`` on its default start method, as its users run it (on
    forkserver its round trip takes milliseconds here: 1.8k no-op tasks/s against 24k on
    fork, measured on 3.11)."""
    name = "mp.Pool"

    def start(self) -> Any:
        return multiprocessing.Pool(self.workers)

    def submit_all(self, p: Any, fn: Callable[..., Any], items: list[Any]) -> list[Any]:
        return [r.get() for r in [p.apply_async(fn, (x,)) for x in items]]

    def call(self, p: Any, fn: Callable[..., Any], x: Any, timeout: float | None = None) -> Any:
        return p.apply_async(fn, (x,)).get(timeout)

    def abandon(self, p: Any) -> None:
        # terminate() itself hangs once a worker died holding the task queue's lock; kill
        # the workers and drop the pool (its threads are daemons), and cancel the exit-time
        # finalizer that would call terminate() again.
        p._worker_handler._state = multiprocessing.pool.TERMINATE  # no more respawns
        for process in list(p._pool):
            process.kill()
            process.join(5)
        p._terminate.cancel()

    def map(self, p: Any, fn: Callable[..., Any], items: Any, chunksize: int) -> list[Any]:
        return list(p.imap(fn, items, chunksize=chunksize))

    def stop(self, p: Any) -> None:
        p.close()
        p.join()


class PoolPoolAdapter(MultiprocessingPoolAdapter):
    """``pool.Pool``, the ``multiprocessing.Pool`` face, on the same default start method
    as ``mp.Pool``'s row; its ratios are to that row."""
    name = "pool.Pool"

    def start(self) -> Any:
        return pool.Pool(self.workers)

    def abandon(self, p: Any) -> None:
        p.terminate()


# Each row's ratio is to this row, in the same run: pool.Pool's to multiprocessing.Pool's.
BASELINE_OF = {"pool.Pool": "mp.Pool"}


class JoblibAdapter(Adapter):
    """``joblib.Parallel`` on its default backend (loky, with its memory-mapped arrays:
    an argument above ``max_nbytes`` is dumped to a file in shared memory and mapped by the
    worker, and a result that views one comes back as a mapping of that file). Measured
    for the array row only: its start and its other rows are loky's own, already there."""
    name = "joblib"
    rows = {"64 MiB numpy array there and back, first, MB/s",
            "64 MiB numpy array there and back, again, MB/s"}

    def start(self) -> Any:
        import joblib  # type: ignore[import-not-found]
        parallel = joblib.Parallel(n_jobs=self.workers)
        parallel.__enter__()  # its workers are kept between calls, as a pool's
        return parallel

    def call(self, p: Any, fn: Callable[..., Any], x: Any, timeout: float | None = None) -> Any:
        import joblib
        return p([joblib.delayed(fn)(x)])[0]

    def worker_pids(self, p: Any) -> set[int]:
        import joblib
        return set(p(joblib.delayed(worker_pid)(x) for x in range(self.workers * 20)))

    def stop(self, p: Any) -> None:
        p.__exit__(None, None, None)


def available_adapters() -> list[type[Adapter]]:
    adapters: list[type[Adapter]] = [PoolAdapter, StdlibAdapter, MultiprocessingPoolAdapter,
                                     PoolPoolAdapter]
    try:
        import loky  # type: ignore[import-not-found]

        class LokyAdapter(Adapter):
            name = "loky"

            def start(self) -> Any:
                return loky.ProcessPoolExecutor(self.workers)

            def abandon(self, p: Any) -> None:
                p.shutdown(wait=False, kill_workers=True)  # (no cancel_futures in loky)
        adapters.append(LokyAdapter)
    except ImportError:
        pass
    try:
        import joblib  # noqa: F401
        adapters.append(JoblibAdapter)
    except ImportError:
        pass
    return adapters


# --- the machine's limits -----------------------------------------------------------------

def _write_all(conn: Any, total: int) -> None:
    fd = conn.fileno()  # a Connection, so that every start method passes the descriptor
    block = b"\0" * (1 << 20)
    while total > 0:
        total -= os.write(fd, block[:min(total, len(block))])
    conn.close()


def pipe_bandwidth(ctx: Any, total: int = 256 << 20) -> float:
    """One-way pipe throughput between two processes (raw os.read/os.write), bytes/s."""
    reader, writer = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_write_all, args=(writer, total))
    started = time.perf_counter()
    process.start()
    writer.close()
    received = 0
    while chunk := os.read(reader.fileno(), 1 << 20):
        received += len(chunk)
    elapsed = time.perf_counter() - started
    reader.close()
    process.join()
    assert received == total
    return total / elapsed


# --- workloads: each returns {metric: value} ----------------------------------------------

def w_submit(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    started = time.perf_counter()
    adapter.submit_all(p, noop, list(range(n)))
    return {"submit+collect, tasks/s": n / (time.perf_counter() - started)}


def w_map1(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    started = time.perf_counter()
    adapter.map(p, noop, range(n), 1)
    return {"map chunksize=1, tasks/s": n / (time.perf_counter() - started)}


def w_map_chunks(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    items = n * 10
    started = time.perf_counter()
    adapter.map(p, noop, range(items), 1000)
    return {"map chunksize=1000, items/s": items / (time.perf_counter() - started)}


def w_map_default(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    started = time.perf_counter()
    adapter.map_default(p, noop, list(range(n)))
    return {"map default chunks, items/s": n / (time.perf_counter() - started)}


def w_latency(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    times = []
    for i in range(min(n, 3000)):
        started = time.perf_counter()
        adapter.call(p, noop, i)
        times.append(time.perf_counter() - started)
    times.sort()
    return {"sequential p50, us": times[len(times) // 2] * 1e6,
            "sequential p99, us": times[int(len(times) * 0.99)] * 1e6}


def _there_and_back(adapter: Adapter, p: Any, data: Any, label: str) -> dict[str, float]:
    """``data`` to a worker and back, timed twice: the first time in this pool (memory
    that a transfer needs is new to it), and once more (a pool that moves large data
    moves it again and again: what it set up the first time is there)."""
    rates = {}
    for when in ("first", "again"):
        started = time.perf_counter()
        back = adapter.call(p, identity, data)
        elapsed = time.perf_counter() - started
        assert len(back) == len(data)
        del back
        rates[f"{label} there and back, {when}, MB/s"] = 2 * len(data) / elapsed / 1e6
    return rates


def w_bytes(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    return _there_and_back(adapter, p, os.urandom(64 << 20), "64 MiB")


def w_array(adapter: Adapter, p: Any, n: int) -> dict[str, float]:
    """The same for a numpy array (pickled with protocol 5's buffers), if numpy is there."""
    try:
        import numpy
    except ImportError:
        return {}
    data = numpy.frombuffer(os.urandom(64 << 20), dtype=numpy.uint8).copy()
    for _ in range(adapter.workers * 2):
        adapter.call(p, identity, data[:1])  # every worker has imported numpy before timing
    return _there_and_back(adapter, p, data, "64 MiB numpy array")


def w_cpu(adapter: Adapter, p: Any, n: int, work: int, single: float) -> dict[str, float]:
    started = time.perf_counter()
    adapter.map(p, spin, [work] * 64, 1)
    elapsed = time.perf_counter() - started
    ideal = 64 * single / adapter.workers
    return {"CPU-bound, fraction of ideal": ideal / elapsed}


WORKLOADS = [w_submit, w_map1, w_map_default, w_map_chunks, w_latency, w_bytes, w_array]


def start_to_first_result(adapter: Adapter) -> float:
    started = time.perf_counter()
    p = adapter.start()
    adapter.call(p, noop, 1)
    elapsed = time.perf_counter() - started
    adapter.stop(p)
    return elapsed


def shutdown_time(adapter: Adapter) -> float:
    p = adapter.start()
    adapter.worker_pids(p)
    started = time.perf_counter()
    adapter.stop(p)
    return time.perf_counter() - started


def die(_: Any = None) -> None:
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


def crash_to_next_result(adapter: Adapter) -> float | str:
    """From submitting a task whose worker is SIGKILLed while running it, through that
    task's failure, to the next task's result; or what happened instead."""
    p = adapter.start()
    adapter.worker_pids(p)
    started = time.perf_counter()
    try:
        try:
            adapter.call(p, die, None, timeout=10)
        except (TimeoutError, multiprocessing.TimeoutError):
            raise
        except Exception:
            pass  # the crash, as each pool reports it
        adapter.call(p, noop, 1, timeout=10)
        elapsed: float | str = time.perf_counter() - started
        adapter.stop(p)
        return elapsed
    except (TimeoutError, multiprocessing.TimeoutError):
        adapter.abandon(p)
        return "hung"       # e.g. a worker died holding a lock the others need
    except Exception as exc:
        adapter.abandon(p)
        return f"broke ({type(exc).__name__})"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(adapter: Adapter, seconds: float = 2.0) -> float:
    """Percent of one core the parent and its workers use while the pool is idle."""
    p = adapter.start()
    workers = adapter.worker_pids(p)
    time.sleep(0.3)
    parent0, workers0 = time.process_time(), sum(_cpu_seconds(w) for w in workers)
    time.sleep(seconds)
    parent1, workers1 = time.process_time(), sum(_cpu_seconds(w) for w in workers)
    adapter.stop(p)
    return 100 * ((parent1 - parent0) + (workers1 - workers0)) / seconds


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def parent_memory(adapter: Adapter, tasks: int) -> list[float]:
    """Parent RSS (MiB) after each tenth of ``tasks`` no-op tasks (map, lazily)."""
    p = adapter.start()
    samples = []
    step = max(1, tasks // 10)
    for _ in range(10):
        for _ in p.map(noop, range(step), chunksize=1, buffersize=256):
            pass
        gc.collect()
        samples.append(_rss() / 2**20)
    adapter.stop(p)
    return samples


# --- reporting ----------------------------------------------------------------------------

def fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def report(title: str, results: dict[str, dict[str, list[float]]], names: list[str],
           lower_is_better: bool = False) -> None:
    print(f"\n{title}")
    metrics = list(next(iter(results.values())).keys())
    header = f"  {'':30}" + "".join(f"{n:>34}" for n in names)
    print(header)
    for metric in metrics:
        row = f"  {metric:30}"
        for name in names:
            values = results[name].get(metric)
            if not values:
                row += f"{'n/a':>34}"
                continue
            median = statistics.median(values)
            cell = f"{fmt(median)} ({fmt(min(values))}-{fmt(max(values))})"
            baseline = BASELINE_OF.get(name, "stdlib")
            base = results.get(baseline, {}).get(metric)
            if base and name != "stdlib":
                suffix = "" if baseline == "stdlib" else " mp"
                cell += f" {median / statistics.median(base):.2f}x{suffix}"
            row += f"{cell:>34}"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", default="forkserver",
                        choices=multiprocessing.get_all_start_methods())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--memory-tasks", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tasks, args.memory_tasks = 1, 2_000, 20_000
    ctx = multiprocessing.get_context(args.start_method)
    adapters = [cls(args.workers, ctx) for cls in available_adapters()]
    names = [a.name for a in adapters]
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.workers} workers, "
          f"start method {args.start_method} (mp.Pool: its default, "
          f"{multiprocessing.get_start_method()}), {args.rounds} rounds, median (min-max) "
          f"and ratio to the stdlib (pool.Pool's: to mp.Pool's, marked mp)")

    ping = [pipe_ping_pong(ctx) for _ in range(args.rounds)]
    bandwidth = [pipe_bandwidth(ctx) for _ in range(args.rounds)]
    print(f"\nThe machine: multiprocessing.Pipe ping-pong {fmt(statistics.median(ping) * 1e6)} us"
          f" round trip; os.pipe one way {fmt(statistics.median(bandwidth) / 1e6)} MB/s")

    # One task of the CPU-bound workload, in this process: the ideal is 64 of them / workers.
    work = 200_000
    started = time.perf_counter()
    spin(work)
    per_call = time.perf_counter() - started
    work = int(work * 0.020 / per_call)  # about 20 ms each
    single = min(_timed(lambda: spin(work)) for _ in range(5))

    results: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for round_number in range(args.rounds):
        order = adapters[round_number % len(adapters):] + adapters[:round_number % len(adapters)]
        for adapter in order:
            p = adapter.start()
            adapter.worker_pids(p)  # every worker up before timing
            rows = getattr(adapter, "rows", None)  # None: every row
            for workload in WORKLOADS + [lambda a, p, n: w_cpu(a, p, n, work, single)]:
                if rows is not None and workload is not w_array:
                    continue
                for metric, value in workload(adapter, p, args.tasks).items():
                    results[adapter.name].setdefault(metric, []).append(value)
            adapter.stop(p)
    report("Throughput and latency (rates: higher is better; us: lower is better)",
           results, names)

    times: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    crashes: dict[str, list[str]] = {n: [] for n in names}
    for round_number in range(args.rounds):
        for adapter in adapters:
            if getattr(adapter, "rows", None) is not None:
                continue  # measured for some rows only
            entry = times[adapter.name]
            entry.setdefault("start -> first result, ms", []).append(
                start_to_first_result(adapter) * 1000)
            entry.setdefault("shutdown of an idle pool, ms", []).append(
                shutdown_time(adapter) * 1000)
            crash = crash_to_next_result(adapter)
            entry.setdefault("crash -> next result, ms", [])
            if isinstance(crash, float):
                entry["crash -> next result, ms"].append(crash * 1000)
            else:
                crashes[adapter.name].append(crash)
            entry.setdefault("idle, % of a core", []).append(idle_cpu(adapter))
    report("Life cycle (lower is better)", times,
           [a.name for a in adapters if getattr(a, "rows", None) is None])
    for name, outcomes in crashes.items():
        for what in sorted(set(outcomes)):
            print(f"  after a worker's SIGKILL, {name} {what} in {outcomes.count(what)} of "
                  f"{args.rounds} rounds: no next result")

    print(f"\nParent memory over {args.memory_tasks:,} tasks (pool, map with buffersize), MiB "
          f"after each tenth:")
    samples = parent_memory(adapters[0], args.memory_tasks)
    print("  " + " ".join(f"{s:.1f}" for s in samples) +
          f"   (growth after the first tenth: {samples[-1] - samples[0]:+.1f} MiB)")


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()

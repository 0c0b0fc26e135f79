"""What this machine can do at best, for the targets of benchmarks/compare.py that pool
does not meet: the floors under a round trip, a start and a large transfer.

Usage: python benchmarks/floors.py [--rounds N]

Prints medians over N rounds of:
- a thread hand-off through ``multiprocessing.connection.wait`` (a round trip through
  pool crosses four such hand-offs: caller -> dispatcher -> worker -> dispatcher -> caller;
  the raw Pipe ping-pong of compare.py crosses two);
- a forkserver child's start and join, and ``python -c pass`` (a pool's first result needs
  at least a worker start; the stdlib's needs the same);
- copying 64 MiB: into memory already touched, and into fresh memory (anonymous and
  ``memfd`` shared memory): a transfer hands the receiver memory it did not have before;
- with numpy installed, a 64 MiB array there and back through one-copy shared memory
  (``memfd_create``, pickle protocol 5 buffers, the receiver mapping the sender's
  descriptor through ``/proc/PID/fd``), side by side with the stdlib's
  ``ProcessPoolExecutor`` in the same run. pool's own transport (``pool/_wire/segments.py``)
  goes further: its segments are reused, so their pages are already touched, and an array
  arrives as a view (docs/benchmarks.rst, "Large data").
Linux only for the memfd rows. Stdlib only, plus numpy for the last row.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import mmap
import multiprocessing
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable

SIZE = 64 << 20


def median_ms(action: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def hand_off_us(count: int = 5000) -> float:
    """One thread writes a byte; another, blocked in connection.wait, reads it and answers."""
    there_r, there_w = os.pipe()
    back_r, back_w = os.pipe()

    def echo() -> None:
        for _ in range(count):
            wait([there_r])
            os.read(there_r, 1)
            os.write(back_w, b"x")
    thread = threading.Thread(target=echo)
    thread.start()
    started = time.perf_counter()
    for _ in range(count):
        os.write(there_w, b"x")
        os.read(back_r, 1)
    elapsed = time.perf_counter() - started
    thread.join()
    for fd in (there_r, there_w, back_r, back_w):
        os.close(fd)
    return elapsed / count / 2 * 1e6


def noop() -> None:
    pass


def identity(value: Any) -> Any:
    return value


# --- one-copy shared memory ----------------------------------------------------------------

def to_shared(value: Any) -> tuple[int, bytes, list[int]]:
    """Pickle with protocol 5; copy the out-of-band buffers into a new memfd (one copy)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(value, 5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    size = max(sum(view.nbytes for view in views), 1)
    fd = os.memfd_create("pool-floor")
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as segment:
        offset = 0
        for view in views:
            segment[offset:offset + view.nbytes] = view
            offset += view.nbytes
    return fd, head, [view.nbytes for view in views]


def from_shared(pid: int, fd: int, head: bytes, lengths: list[int]) -> Any:
    """Map the sender's memfd and unpickle over it: no copy."""
    opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    segment = memoryview(mmap.mmap(opened, max(sum(lengths), 1)))
    os.close(opened)
    buffers, offset = [], 0
    for length in lengths:
        buffers.append(segment[offset:offset + length])
        offset += length
    return pickle.loads(head, buffers=buffers)


def shared_echo(conn: Any, parent: int) -> None:
    while (message := conn.recv()) is not None:
        value = from_shared(parent, *message)
        conn.send("mapped")
        fd, head, lengths = to_shared(identity(value))
        del value
        conn.send((fd, head, lengths))
        conn.recv()  # the parent has mapped it
        os.close(fd)


def shared_memory_round_trips(rounds: int) -> tuple[float, float]:
    """(one-copy shared memory, stdlib) medians in ms for a 64 MiB array there and back."""
    import numpy
    data = numpy.frombuffer(os.urandom(SIZE), dtype=numpy.uint8).copy()
    context = multiprocessing.get_context("forkserver")
    here, there = context.Pipe()
    echo = context.Process(target=shared_echo, args=(there, os.getpid()))
    echo.start()

    def shared() -> None:
        fd, head, lengths = to_shared(data)
        here.send((fd, head, lengths))
        here.recv()
        os.close(fd)
        back = from_shared(echo.pid, *here.recv())
        here.send("mapped")
        assert back.nbytes == SIZE and back[SIZE // 3] == data[SIZE // 3]

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as stdlib:
        stdlib.submit(identity, data[:1]).result()  # numpy imported before timing
        shared_times, stdlib_times = [], []
        for _ in range(rounds):  # interleaved: the machine is shared and noisy
            shared_times.append(median_ms(shared, 1))
            stdlib_times.append(median_ms(lambda: stdlib.submit(identity, data).result(), 1))
    here.send(None)
    echo.join()
    return statistics.median(shared_times), statistics.median(stdlib_times)


def copies(rounds: int) -> dict[str, float]:
    source = os.urandom(SIZE)
    touched = memoryview(bytearray(SIZE))  # a memoryview's slice assignment is one memcpy
    figures = {"into touched memory": median_ms(lambda: touched.__setitem__(slice(None), source),
                                                rounds),
               "into fresh anonymous memory": median_ms(lambda: bytearray(source), rounds)}
    if hasattr(os, "memfd_create"):
        def into_memfd() -> None:
            fd = os.memfd_create("pool-floor")
            os.ftruncate(fd, SIZE)
            with mmap.mmap(fd, SIZE) as segment:
                segment[:] = source
            os.close(fd)
        figures["into a fresh memfd"] = median_ms(into_memfd, rounds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    print(f"thread hand-off through connection.wait: {hand_off_us():.1f} µs")
    forkserver = multiprocessing.get_context("forkserver")

    def start_and_join() -> None:
        child = forkserver.Process(target=noop)
        child.start()
        child.join()
    start_and_join()
    print(f"forkserver child start + join: {median_ms(start_and_join, rounds):.1f} ms")
    print(f"python -c pass: "
          f"{median_ms(lambda: subprocess.run([sys.executable, '-c', 'pass']), rounds):.1f} ms")
    for what, ms in copies(rounds).items():
        print(f"copy 64 MiB {what}: {ms:.1f} ms")
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("numpy is not installed: no shared-memory row")
        return
    if not hasattr(os, "memfd_create"):
        return
    shared, stdlib = shared_memory_round_trips(rounds)
    print(f"64 MiB numpy array there and back: one-copy shared memory {shared:.1f} ms "
          f"({2 * SIZE / shared / 1e3:.0f} MB/s), stdlib {stdlib:.1f} ms "
          f"({2 * SIZE / stdlib / 1e3:.0f} MB/s): {stdlib / shared:.2f}x the stdlib")


if __name__ == "__main__":
    main()

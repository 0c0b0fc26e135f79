"""The tasks of ``python -m pool demo``: ordinary work, a segfault, a SIGKILL, and a task
stuck in C code (holding the GIL) that its timeout stops.

Runs in: the worker processes (the functions) and the CLI (``run_demo``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any, Callable, TextIO

from .._errors import TaskTimeout, WorkerDied
from .._executor import ProcessPool


def sum_of_squares(n: int) -> int:
    return sum(i * i for i in range(n))


def segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def killed_from_outside() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does


def catastrophic_regex() -> object:
    import re
    return re.match(r"(a+)+$", "a" * 48 + "b")  # hours of backtracking; never lets go of the GIL


def run_demo(out: TextIO = sys.stdout, start_method: str | None = None) -> int:
    import multiprocessing
    context = multiprocessing.get_context(start_method) if start_method else None
    calls: list[tuple[Callable[..., Any], tuple[int, ...]]] = [
        (sum_of_squares, (10,)), (segfault, ()), (sum_of_squares, (100,)),
        (killed_from_outside, ()), (sum_of_squares, (1000,)), (sum_of_squares, (10_000,))]
    with ProcessPool(max_workers=2, mp_context=context) as pool:
        futures = [pool.submit(fn, *args) for fn, args in calls]
        futures.append(pool.schedule(catastrophic_regex, timeout=1.0))
        failures = 0
        for number, future in enumerate(futures, 1):
            error = future.exception(timeout=60)
            if error is None:
                print(f"task {number}: ok, {future.result()}", file=out)
                continue
            failures += 1
            print(f"task {number}: FAILED with {type(error).__name__}:", file=out)
            print("    " + str(error).replace("\n", "\n    "), file=out)
            assert isinstance(error, (WorkerDied, TaskTimeout))
        after = pool.submit(sum_of_squares, 10).result(timeout=60)
        print(f"\n{failures} workers ended (two died, one was stopped by its timeout), each "
              f"failing only its own task; the pool carried on (sum_of_squares(10) "
              f"afterwards = {after}).", file=out)
    return 0 if failures == 3 else 1

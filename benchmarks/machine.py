"""The machine's own floor, printed beside every benchmark's figures: a shared machine is
never as quiet on one run as on another, and pool's figures move with it.

Imports nothing of pool: ``ab.py`` runs it in an interpreter without pool.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def _echo(conn: Any) -> None:
    while True:
        message = conn.recv_bytes()
        if not message:
            return
        conn.send_bytes(message)


def pipe_ping_pong(ctx: Any, rounds: int = 3000) -> float:
    """Median round trip (seconds) of a small message over multiprocessing.Pipe."""
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_echo, args=(child,))
    process.start()
    child.close()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        parent.send_bytes(b"x" * 64)
        parent.recv_bytes()
        times.append(time.perf_counter() - started)
    parent.send_bytes(b"")
    process.join()
    return statistics.median(times[rounds // 10:])

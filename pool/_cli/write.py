"""Writing the command's output, messages and job log to a descriptor that may block (a
pipe nobody reads, a stalled terminal) without keeping a stop signal waiting.

Runs in: the command's main thread.
Guarantees: ``write_or_give_up`` waits for the descriptor in slices (``poll``), then writes
only what the descriptor takes without blocking. Between slices it asks ``give_up``; once
that says yes, it stops waiting. This is DESIGN contract 9 for writes: a signal handler
only records the signal, so a write blocked in the kernel would be retried forever.
"""

from __future__ import annotations

import os
import select
import stat
from typing import Callable

# How long a write waits for the descriptor before it asks whether to give up.
_WRITE_SLICE_MS = 100
# What one write to a file or terminal takes at most.
_BLOCK_BYTES = 1 << 16


class WriteAbandoned(Exception):
    """A write was blocked and ``give_up`` said to stop waiting. ``written`` bytes of it
    were written; they end at a line break if lines are shorter than a pipe's atomic
    write."""

    def __init__(self, written: int) -> None:
        super().__init__(written)
        self.written = written


class WriteFailed(Exception):
    """A write failed (``error``) after ``written`` bytes of it had been written."""

    def __init__(self, written: int, error: OSError) -> None:
        super().__init__(written, error)
        self.written = written
        self.error = error


def write_or_give_up(fd: int, data: bytes | bytearray, give_up: Callable[[], bool]) -> None:
    """All of ``data`` to ``fd``, never blocked for longer than a slice at a time, and not
    at all once ``give_up`` says so. Raises WriteAbandoned or WriteFailed."""
    written = 0
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    # What one write takes without blocking once poll says writable: a pipe or socket
    # guarantees PIPE_BUF; a file or terminal takes a block.
    piece = select.PIPE_BUF if _is_pipe_or_socket(fd) else _BLOCK_BYTES
    with memoryview(data) as whole:   # released on the way out: the caller resizes data
        while written < len(whole):
            if not poller.poll(0 if give_up() else _WRITE_SLICE_MS):
                if give_up():
                    raise WriteAbandoned(written)
                continue
            end = min(written + piece, len(whole))
            # End each write at a line break, if there is one: giving up tears no line.
            if end < len(whole):
                newline = data.rfind(b"\n", written, end)
                if newline >= 0:
                    end = newline + 1
            try:
                with whole[written:end] as part:
                    written += os.write(fd, part)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise WriteFailed(written, exc) from exc


def _is_pipe_or_socket(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)

"""The wakeup handle: how caller threads interrupt the dispatcher's ``wait()``.

Owns: one non-blocking pipe. Runs in: ``wake()`` in any thread, ``drain()`` in the
dispatcher thread only.
Guarantees: ``wake()`` never blocks and leaves at most one byte in the pipe; a ``wake()``
that happens after ``drain()`` started is never lost (the flag is cleared before the
dispatcher reads its command queue). It carries no data: commands travel in a queue.
Assumes: the dispatcher calls ``drain()`` before it reads the command queue.
"""

from __future__ import annotations

import os
import threading


class Wakeup:
    def __init__(self) -> None:
        self.reader, self._writer = os.pipe()
        os.set_blocking(self.reader, False)
        os.set_blocking(self._writer, False)
        # Its own lock, held for a flag test and a 1-byte write: never shared with anything
        # else, so no caller can deadlock on it (CPython gh-105829 was a wakeup guarded by
        # another lock).
        self._lock = threading.Lock()
        self._pending = False
        self._closed = False

    @property
    def fds(self) -> tuple[int, int]:
        return self.reader, self._writer

    def wake(self) -> None:
        with self._lock:
            if self._pending or self._closed:
                return
            self._pending = True
            try:
                os.write(self._writer, b"\0")
            except BlockingIOError:
                pass  # cannot happen with one pending byte, and a full pipe wakes anyway

    def drain(self) -> None:
        with self._lock:
            self._pending = False
            try:
                os.read(self.reader, 64)
            except BlockingIOError:
                pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.reader)
                os.close(self._writer)

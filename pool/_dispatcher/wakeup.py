"""The wakeup handle: how caller threads interrupt the dispatcher's ``wait()``.

Owns: one non-blocking pipe. Runs in: ``wake()`` in any thread, ``drain()`` in the
dispatcher thread only.
Guarantees: ``wake()`` never blocks (for more than ``_STUCK_LOCK_SECONDS``, and only after a
Ctrl-C left the lock held) and leaves at most one byte in the pipe while the lock works; a
``wake()`` that happens after ``drain()`` started is never lost (the flag is cleared before
the dispatcher reads its command queue). It carries no data: commands travel in a queue.
Assumes: the dispatcher calls ``drain()`` before it reads the command queue.
"""

from __future__ import annotations

import os
import threading


# How long any side waits for the lock before going on without it. Only a thread that a
# Ctrl-C interrupted between taking the lock and the ``try`` that gives it back can leave
# it held (CPython runs signal handlers at instruction boundaries: bpo-29988); then every wake would
# wait for it for good, the exit's too. Going on without it is safe: a byte more in the
# pipe only wakes the loop once more.
_STUCK_LOCK_SECONDS = 0.25


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
        held = self._lock.acquire(timeout=_STUCK_LOCK_SECONDS)
        try:
            if self._closed or (self._pending and held):
                return
            self._pending = True
            try:
                os.write(self._writer, b"\0")
            except BlockingIOError:
                pass  # cannot happen with one pending byte, and a full pipe wakes anyway
        finally:
            if held:
                self._lock.release()

    def drain(self) -> None:
        held = self._lock.acquire(timeout=_STUCK_LOCK_SECONDS)
        try:
            # Read, then clear: a wake() between the two (possible only without the lock)
            # leaves its byte in the pipe, so the next wait() returns; cleared first, the
            # read could take that byte and leave the flag set with nothing to wake on.
            try:
                while len(os.read(self.reader, 64)) == 64:
                    pass
            except BlockingIOError:
                pass
            self._pending = False
        finally:
            if held:
                self._lock.release()

    def close(self) -> None:
        held = self._lock.acquire(timeout=_STUCK_LOCK_SECONDS)
        try:
            if not self._closed:
                self._closed = True
                os.close(self.reader)
                os.close(self._writer)
        finally:
            if held:
                self._lock.release()

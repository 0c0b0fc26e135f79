"""Shared memory for large payloads: the segments a call's or a result's large buffers
travel in (``memfd``s, never named), and the cache that reuses them.

Owns: the segments this process made, and which are idle (``cache``).
Runs in: callers' threads (a call's segment is taken at submit), the dispatcher thread
(segments come back, are lent, and are trimmed), and any thread that lets go of a call or
a result (which only queues its segment's return).
Guarantees:
- a segment is used again only once no process maps it: ``retired`` ones never are (see
  ``shared_calls``, ``loans``);
- memory stays bounded and goes back to the system: at most ``MAX_SEGMENTS`` segments at
  once (and a quarter of the descriptor limit; beyond, payloads go through the pipe), idle
  ones at most ``IDLE_BYTES``, each closed after ``IDLE_SECONDS`` unused, or when the last
  dispatcher ends. A ``memfd`` has no name, so a crash, even the parent's, leaves no file;
- a forked child never uses its parent's segments: it starts with an empty cache, and a
  result its parent still shows the user is never reused once a child may map it.
Assumes: ``_platform.SHARED_MEMORY`` (Linux: ``memfd_create``, and ``/proc/PID/fd`` to
open another process's segment). Where it is off, nothing here is used: every payload
goes through the pipe.

The transport's other parts: ``payloads`` (what is pickled out of the stream, and the
envelope saying where it lies), ``shared_calls`` (a call's segment: the parent copies in,
the worker views), ``loans`` (a result's: the parent lends, the worker writes).
"""

from __future__ import annotations

import collections
import fcntl
import mmap
import os
import time
import weakref

from .. import _platform
from .._locks import InterruptSafeLock

# A payload at least this large travels in a segment. Below it, mapping and unmapping
# (tens of microseconds) cost more than the pipe saves.
SHARED_ABOVE = 256 << 10
# Segments alive at once (in use, lent, idle, or viewed by a result the caller holds).
# Each costs a descriptor; beyond this payloads go through the pipe.
MAX_SEGMENTS = 256
# Idle segments kept for reuse: at most this many bytes, each for at most this long.
# Reuse is what makes a transfer fast: writing into pages already touched costs a tenth
# of writing into fresh ones (benchmarks/floors.py).
IDLE_BYTES = 512 << 20
IDLE_SECONDS = 10.0

# Segments are made and grown in steps of this, so that one used for calls (a header more)
# and for results in turn is not grown, and so mapped again, for a few bytes.
GROWTH_STEP = 1 << 20
# A segment may grow, never shrink: a worker that cut one short would make every view of it
# fault (SIGBUS) in the parent.
_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0) if hasattr(fcntl, "F_ADD_SEALS") else 0
_MEMFD_FLAGS = (getattr(os, "MFD_CLOEXEC", 0)
                | (getattr(os, "MFD_ALLOW_SEALING", 0) if _SEAL_SHRINK else 0))
# Mapped with every page at once: a page faulted in on first touch costs several times
# more, for a payload that is read or written whole (64 MiB: 4 ms against 20).
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class NoRoom(MemoryError):
    """This process has no memory to map a result's segment: that task alone fails, as
    with a reply through the pipe that it has no memory for."""


class LargePayload(Exception):
    """Raised by a collector (``picklers``) on a payload of at least ``SHARED_ABOVE``
    bytes: that object is pickled again, for a segment (``payloads``)."""


def enabled() -> bool:
    return _platform.SHARED_MEMORY


def openable() -> bool:
    """Whether a worker may open this process's segments: through /proc/PID/fd, which the
    kernel allows only while this process is "dumpable". Not so for a program started
    setuid or setgid, one that changed its user or group, or one that said so
    (``prctl(PR_SET_DUMPABLE, 0)``). Asked once, when a call first has a large payload."""
    global _openable
    if _openable is None:
        _openable = _dumpable()
    return _openable


_openable: bool | None = None


def _dumpable() -> bool:
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        return bool(prctl(3, 0, 0, 0, 0) == 1)  # PR_GET_DUMPABLE: 1, this user may look
    except (ImportError, OSError, AttributeError):
        return os.getuid() == os.geteuid() and os.getgid() == os.getegid()


# --- segments and their cache (the parent) -------------------------------------------------

class Segment:
    """A ``memfd`` of ``size`` bytes, owned by the process that made it (``pid``)."""

    __slots__ = ("fd", "size", "ino", "pid", "view", "idle_since", "retired")

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("pool-segment", _MEMFD_FLAGS)
        self.pid = os.getpid()
        self.size = 0
        self.view: mmap.mmap | None = None  # this process's own, for writing calls
        self.idle_since = 0.0
        self.retired = False  # another process may still map it: never reused
        try:
            if _SEAL_SHRINK:  # no process may cut it short under another's views
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEAL_SHRINK)
            self.ino = os.fstat(self.fd).st_ino
            self.grow(size)
        except BaseException:
            os.close(self.fd)
            raise

    def grow(self, size: int) -> None:
        self.size = max(self.size, os.fstat(self.fd).st_size)  # a worker may have grown it
        if size > self.size:
            size = -(-size // GROWTH_STEP) * GROWTH_STEP
            if self.view is not None:
                self.view.close()
                self.view = None
            os.ftruncate(self.fd, size)
            self.size = size

    def writable(self) -> mmap.mmap:
        if self.view is None:
            self.view = mmap.mmap(self.fd, self.size, flags=MAP_FLAGS)
        return self.view

    def kept(self) -> bool:
        """A worker marked this call's segment kept (see ``CallView.release``)."""
        return self.view is not None and self.view[0] == 1

    def close(self) -> None:
        if self.view is not None:
            self.view.close()
            self.view = None
        if self.fd >= 0 and self.pid == os.getpid():
            os.close(self.fd)
        self.fd = -1


class SegmentCache:
    """The segments of this process, and those idle for reuse. Thread-safe: callers take
    segments, the dispatcher gives them back, and a segment may come back in any thread,
    even inside the lock's own section (a garbage collection that frees a call or a
    result), so returns are only queued (``deque.append`` is atomic) and settled under
    the lock, by a thread not already changing the lists (``_busy``).

    Idle segments are kept only while a dispatcher runs (``active``): it trims them
    (``trim``). With none running, a segment that comes back is closed at once."""

    def __init__(self) -> None:
        self._lock = InterruptSafeLock()
        self._pid = os.getpid()
        self._returned: collections.deque[Segment] = collections.deque()
        self._idle: list[Segment] = []
        self._idle_bytes = 0
        self._live: set[Segment] = set()  # every segment alive that this cache made
        self._viewed: set[Segment] = set()  # results the caller's objects still see
        self._busy = False
        self._next_trim: float | None = None
        self.active = 0  # dispatchers running in this process

    def dispatcher_started(self) -> None:
        with self._lock:
            self.active += 1

    def dispatcher_ended(self) -> None:
        """A dispatcher ended: with none left, no idle segment is kept."""
        with self._lock:
            self.active -= 1
            self._settle(time.monotonic())

    @property
    def count(self) -> int:
        """Segments alive that this cache made."""
        return len(self._live)

    def take(self, size: int, most: int | None = None) -> Segment | None:
        """A segment of at least ``size`` bytes: the smallest idle one that fits (and holds
        at most ``most``, if given), else the largest idle one grown (unless ``most`` is
        given), else a new one; None if this process may not have more."""
        with self._lock:
            if self._busy:  # a collection inside this section: the pipe, this once
                return None
            self._busy = True
            try:
                self._settle(time.monotonic())
                fits = [s for s in self._idle
                        if s.size >= size and (most is None or s.size <= most)]
                segment = (min(fits, key=_size) if fits else
                           max(self._idle, key=_size) if self._idle and most is None
                           else None)
                if segment is not None:
                    self._idle.remove(segment)
                    self._idle_bytes -= segment.size
                elif len(self._live) >= _most_segments():
                    return None
                else:
                    try:
                        segment = Segment(size)
                    except OSError:  # out of descriptors or of memory: the pipe, then
                        return None
                    self._live.add(segment)
            finally:
                self._busy = False
        try:
            segment.grow(size)
        except OSError:
            self.give_back(segment)
            return None
        return segment

    def give_back(self, segment: Segment) -> None:
        """``segment`` is no longer used by this process (nor, unless it is marked
        ``retired``, by any other)."""
        self._viewed.discard(segment)
        self._returned.append(segment)
        if not self.active:  # no dispatcher will trim: close it now, if we may
            self.trim()

    def give_back_when_unviewed(self, segment: Segment, view: mmap.mmap) -> None:
        """Give ``segment`` back once ``view``, through which the caller's objects see it,
        is gone with the last of them."""
        self._viewed.add(segment)
        # Not at exit: objects still alive then may still be read by exit handlers.
        weakref.finalize(view, self.give_back, segment).atexit = False
        try:
            view.close()  # closes only if nothing views it any more
        except BufferError:
            pass

    def trim(self, now: float | None = None) -> float | None:
        """Settle returns and close what has been idle too long; when to call again (a
        segment the caller's objects view comes back without a word, so while there is
        one, again in ``IDLE_SECONDS``). Does nothing if another thread is at it, or this
        one (a collection inside the lock)."""
        now = time.monotonic() if now is None else now
        if not self._returned and (self._next_trim is None or now < self._next_trim):
            return self._next_trim if not self._viewed else now + IDLE_SECONDS
        if not self._lock.try_acquire(0):  # (its promise: the try follows at once)
            return now + IDLE_SECONDS
        try:
            if not self._busy:
                self._busy = True
                try:
                    self._settle(now)
                finally:
                    self._busy = False
            return self._next_trim if not self._viewed else now + IDLE_SECONDS
        finally:
            self._lock.release()

    def before_fork(self) -> None:
        # The child inherits every mapping, so a result the caller holds is seen by it too:
        # its segment must never be written again.
        for segment in list(self._viewed):
            segment.retired = True

    def idle_bytes(self) -> int:
        return self._idle_bytes

    def _settle(self, now: float) -> None:
        returned, idle = self._returned, self._idle
        while returned:
            segment = returned.popleft()
            if segment.pid != self._pid or segment not in self._live:
                continue  # a forked child's copy of its parent's segment: not ours
            if segment.retired or not self.active:
                self._forget(segment)
            else:
                segment.idle_since = now
                idle.append(segment)
        # Too many bytes idle, or idle too long (or no dispatcher left to use them): the
        # oldest go first. (The sum is counted anew: an interrupt cannot leave it wrong.)
        idle.sort(key=_idle_since)
        self._idle_bytes = sum(map(_size, idle))
        while idle and (self._idle_bytes > IDLE_BYTES or not self.active
                        or now - idle[0].idle_since >= IDLE_SECONDS):
            segment = idle.pop(0)
            self._idle_bytes -= segment.size
            self._forget(segment)
        self._next_trim = idle[0].idle_since + IDLE_SECONDS if idle else None

    def _forget(self, segment: Segment) -> None:
        self._live.discard(segment)
        segment.close()

    def close_in_child(self) -> None:
        """In a forked child: close this process's copies of the parent's segments, so
        that a segment the parent lets go returns its memory to the system."""
        for segment in list(self._live):
            if segment.view is not None:
                try:
                    segment.view.close()
                except BufferError:
                    pass
                segment.view = None
            try:
                os.close(segment.fd)
            except OSError:
                pass
            segment.fd = -1


def _most_segments() -> int:
    """``MAX_SEGMENTS``, or a quarter of this process's descriptor limit if that is less:
    each segment holds a descriptor, which the program and the workers' pipes need too."""
    global _descriptor_share
    if _descriptor_share is None:
        try:
            import resource
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            _descriptor_share = MAX_SEGMENTS if soft == resource.RLIM_INFINITY else soft // 4
        except (ImportError, OSError, ValueError):
            _descriptor_share = MAX_SEGMENTS
    return min(MAX_SEGMENTS, _descriptor_share)


_descriptor_share: int | None = None


def _size(segment: Segment) -> int:
    return segment.size


def _idle_since(segment: Segment) -> float:
    return segment.idle_since


cache = SegmentCache()


def _new_cache_in_child() -> None:
    # The parent's segments are its own: the child starts with none.
    global cache
    cache.close_in_child()
    cache = SegmentCache()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: cache.before_fork(), after_in_child=_new_cache_in_child)

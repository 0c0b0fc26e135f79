"""Shared memory for large payloads: a call's or a result's large buffers travel through
memory both processes map (a *segment*), not through the pipe.

Owns: the segments this process made (``memfd``s, never named), the cache that reuses them
(``cache``), a worker's reply loans (``LoanDesk`` in the parent, ``WorkerDesk`` in the
worker), and the envelope that says where in a segment each payload lies.
Runs in: callers' threads (a call's payloads are copied into a segment at submit), the
dispatcher thread (a result is unpickled from its segment; loans), the worker (a call is
unpickled from its segment; a result is copied into its loan), and any thread that lets
go of a call (``SharedRef.__del__``, which only queues the segment's return).
Guarantees:
- a payload is copied into its segment when the call is submitted, so a caller's later
  change to a bytearray or an array does not change the task; an array then arrives in the
  worker without a copy, a view of the segment; ``bytes`` and ``bytearray`` are copied
  out, since they own their memory;
- a segment is used again only once no process maps it. A call's segment: once its task
  ended, the worker having closed its view of it, or having died. A worker whose task kept
  a view of its arguments marks the segment kept before it replies, and the segment is let
  go, never reused (the worker's view holds its memory until it exits). A result's
  segment: once the caller's objects that view it are gone (the view's ``mmap`` closes);
- a worker writes only into the segment the parent lent it (``LoanDesk``), which the parent
  keeps open, so a result the worker sent before dying is still there to read. The
  parent checks a result's envelope against that loan before it reads a byte of it:
  anything else is ``MalformedFrame``;
- memory stays bounded and goes back to the system: at most ``MAX_SEGMENTS`` segments at
  once (beyond, payloads go through the pipe), idle ones at most ``IDLE_BYTES``, and each
  idle one closed after ``IDLE_SECONDS`` unused, or when the last dispatcher ends. A
  ``memfd`` has no name, so a crash, even the parent's, leaves no file behind;
- a forked child never uses its parent's segments: it starts with an empty cache, and a
  result its parent still shows the user is never reused once a child may map it.
Assumes: ``_platform.SHARED_MEMORY`` (Linux: ``memfd_create``, and ``/proc/PID/fd`` to
open another process's segment). Where it is off, nothing here is used: every payload
goes through the pipe. A process that a task forks while it maps a call's segment keeps
that view (see ``CallView.release``).
"""

from __future__ import annotations

import collections
import fcntl
import io
import mmap
import os
import pickle
import struct
import time
import weakref
from typing import Any

from .. import _platform
from .._locks import InterruptSafeLock
from .frames import Buffers, MalformedFrame

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

MARKER = b"S"  # the first byte of a result body whose payloads are in a segment
# The envelope: pid and descriptor of the segment in the process that owns it, its inode
# (which segment it is), the loan's generation (0 for a call), the number of payloads.
_ENVELOPE = struct.Struct("!IIQQI")
_PAYLOAD = struct.Struct("!QQB")  # offset, length, kind
_BUFFER, _BYTES, _BYTEARRAY = 0, 1, 2
# A call's segment starts with this header: its first byte is 1 once a worker kept it.
_CALL_HEADER = 64
_ALIGN = 64  # every payload starts on this boundary (any dtype's alignment)
# Segments are made and grown in steps of this, so that one used for calls (a header more)
# and for results in turn is not grown, and so mapped again, for a few bytes.
_STEP = 1 << 20
# A segment may grow, never shrink: a worker that cut one short would make every view of it
# fault (SIGBUS) in the parent.
_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0) if hasattr(fcntl, "F_ADD_SEALS") else 0
_MEMFD_FLAGS = (getattr(os, "MFD_CLOEXEC", 0)
                | (getattr(os, "MFD_ALLOW_SEALING", 0) if _SEAL_SHRINK else 0))
# Mapped with every page at once: a page faulted in on first touch costs several times
# more, for a payload that is read or written whole (64 MiB: 4 ms against 20).
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class NoRoom(MemoryError):
    """This process has no memory to map a result's segment: that task alone fails, as
    with a reply through the pipe that it has no memory for."""


class LargePayload(Exception):
    """Raised by a collector (``picklers``) on a payload of at least ``SHARED_ABOVE``
    bytes: that object is pickled again for a segment."""


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
            size = -(-size // _STEP) * _STEP
            if self.view is not None:
                self.view.close()
                self.view = None
            os.ftruncate(self.fd, size)
            self.size = size

    def writable(self) -> mmap.mmap:
        if self.view is None:
            self.view = mmap.mmap(self.fd, self.size, flags=_MAP_FLAGS)
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
    global cache, worker_desk
    cache.close_in_child()
    cache = SegmentCache()
    worker_desk = None  # a task's child is not the worker: it has no loans


def _before_fork() -> None:
    cache.before_fork()
    if current_call is not None:  # a task forks while it views its arguments: the child
        current_call.mark_kept()   # may read them after the task ends, or outlive it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_new_cache_in_child)


# --- pickling with payloads out of the stream ----------------------------------------------

_picklers: dict[type[Any], type[Any]] = {}


def _pickler(base: type[Any]) -> type[Any]:
    """``base`` (the stdlib's pickler or the by-value one), collecting every payload of at
    least ``SHARED_ABOVE`` bytes out of the stream: protocol 5 buffers (arrays) through
    ``buffer_callback``, ``bytes`` and ``bytearray`` as persistent ids."""
    made = _picklers.get(base)
    if made is None:
        class SegmentPickler(base):  # type: ignore[misc]
            def __init__(self, file: Any, payloads: list[tuple[memoryview, int]]) -> None:
                # Not a bound method: the pickler holding it would be a cycle, kept (with
                # every payload it saw) until a garbage collection.
                super().__init__(file, 5, buffer_callback=_out_of_band(payloads))
                self._payloads = payloads
                self._index_of: dict[int, int] = {}  # the same object: the same payload

            def persistent_id(self, obj: Any) -> Any:
                cls = type(obj)
                if (cls is bytes or cls is bytearray) and len(obj) >= SHARED_ABOVE:
                    index = self._index_of.get(id(obj))
                    if index is None:  # (the payload's view keeps obj, and its id, alive)
                        self._payloads.append((memoryview(obj), _BYTES if cls is bytes
                                               else _BYTEARRAY))
                        index = self._index_of[id(obj)] = len(self._payloads) - 1
                    return index
                return None

        made = _picklers[base] = SegmentPickler
    return made


def _out_of_band(payloads: list[tuple[memoryview, int]]) -> Any:
    def buffer_callback(buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # neither C- nor Fortran-contiguous: in the stream
            return True
        if view.nbytes < SHARED_ABOVE:
            return True
        payloads.append((view, _BUFFER))
        return False
    return buffer_callback


def _layout(payloads: list[tuple[memoryview, int]], start: int) -> tuple[list[int], int]:
    offsets = []
    end = start
    for view, _ in payloads:
        end = -(-end // _ALIGN) * _ALIGN
        offsets.append(end)
        end += view.nbytes
    return offsets, end


def _envelope(pid: int, fd: int, ino: int, generation: int,
              payloads: list[tuple[memoryview, int]], offsets: list[int]) -> bytes:
    table = b"".join(_PAYLOAD.pack(offset, view.nbytes, kind)
                     for (view, kind), offset in zip(payloads, offsets))
    return _ENVELOPE.pack(pid, fd, ino, generation, len(payloads)) + table


def _read_envelope(data: Any, limit: int | None = None
                   ) -> tuple[tuple[int, int, int, int], list[tuple[int, int, int]], int]:
    """``(pid, fd, ino, generation)``, the payloads ``(offset, length, kind)``, and where
    the stream starts. Raises MalformedFrame on what cannot be an envelope."""
    view = memoryview(data)
    if len(view) < _ENVELOPE.size:
        raise MalformedFrame("a segment envelope cut short")
    pid, fd, ino, generation, count = _ENVELOPE.unpack_from(view)
    end = _ENVELOPE.size + count * _PAYLOAD.size
    if count == 0 or end > len(view):
        raise MalformedFrame(f"a segment envelope of {count} payloads in {len(view)} bytes")
    payloads = [_PAYLOAD.unpack_from(view, _ENVELOPE.size + i * _PAYLOAD.size)
                for i in range(count)]
    for offset, length, kind in payloads:
        if kind > _BYTEARRAY or (limit is not None and offset + length > limit):
            raise MalformedFrame(f"a payload at {offset} of {length} bytes (kind {kind}) "
                                 f"in a segment of {limit} bytes")
    return (pid, fd, ino, generation), payloads, end


def _load(stream: Any, fd: int, payloads: list[tuple[int, int, int]],
          views: list[memoryview | None]) -> Any:
    """Unpickle ``stream`` whose payloads are in the segment ``fd``: a buffer as the view
    of it in ``views`` (an array becomes a view of the segment), ``bytes`` and
    ``bytearray`` read out of it (they own their memory: one copy, with no mapping)."""
    file = stream if hasattr(stream, "read") else io.BytesIO(stream)
    loaded: dict[int, Any] = {}  # one object per payload, as it was sent

    def persistent_load(index: Any) -> Any:
        if not isinstance(index, int) or not 0 <= index < len(payloads):
            raise pickle.UnpicklingError(f"no payload {index!r}")
        offset, length, kind = payloads[index]
        if kind == _BUFFER:
            raise pickle.UnpicklingError(f"payload {index} is a buffer, not bytes")
        value = loaded.get(index)
        if value is None:
            value = loaded[index] = _read(fd, offset, length, kind)
        return value

    buffers = [view for view in views if view is not None]
    return _SegmentUnpickler(file, buffers, persistent_load).load()


class _SegmentUnpickler(pickle.Unpickler):
    """An unpickler whose persistent ids are a segment's payloads. (A method of a subclass:
    from Python 3.13 an Unpickler's ``persistent_load`` cannot be set on the object.)"""

    def __init__(self, file: Any, buffers: list[memoryview],
                 load_payload: Any) -> None:
        super().__init__(file, buffers=buffers)
        self._load_payload = load_payload

    def persistent_load(self, pid: Any) -> Any:
        return self._load_payload(pid)


# The most Linux reads or writes in one call.
_MOST_PER_CALL = 0x7FFFF000


def _read(fd: int, offset: int, length: int, kind: int) -> bytes | bytearray:
    """A ``bytes`` or ``bytearray`` payload, read from its segment."""
    if kind == _BYTES and length <= _MOST_PER_CALL:
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise pickle.UnpicklingError(f"a payload of {length} bytes cut short")
        return data
    target = bytearray(length)
    view = memoryview(target)
    done = 0
    while done < length:
        count = os.preadv(fd, [view[done:done + _MOST_PER_CALL]], offset + done)
        if count <= 0:
            raise pickle.UnpicklingError(f"a payload of {length} bytes cut short")
        done += count
    view.release()
    return target if kind == _BYTEARRAY else bytes(target)


def _write(fd: int, offset: int, payload: memoryview) -> None:
    done, length = 0, payload.nbytes
    while done < length:
        done += os.pwritev(fd, [payload[done:done + _MOST_PER_CALL]], offset + done)


def _buffers_extent(payloads: list[tuple[int, int, int]]) -> int:
    """What must be mapped of a segment: up to its last buffer payload's end, rounded up
    to a page (0: none, so nothing is mapped: ``bytes`` are read)."""
    buffers = [p for p in payloads if p[2] == _BUFFER]
    return _extent(buffers) if buffers else 0


def _views(mapping: mmap.mmap | None, payloads: list[tuple[int, int, int]]
           ) -> list[memoryview | None]:
    if mapping is None:
        return [None] * len(payloads)
    whole = memoryview(mapping)
    views = [whole[offset:offset + length] if kind == _BUFFER else None
             for offset, length, kind in payloads]
    whole.release()
    return views


# --- calls: the parent copies in, the worker views ----------------------------------------

class SharedRef(bytes):
    """A call's envelope, as a part of its CALL body. The body holds it, and it holds the
    segment: when the last holder lets go (the task ended), the segment goes back to the
    cache, which reuses it unless the worker marked it kept."""

    segment: Segment

    def __del__(self) -> None:
        segment = self.__dict__.get("segment")
        if segment is not None:
            try:
                if segment.kept():
                    segment.retired = True
                cache.give_back(segment)
            except Exception:  # at interpreter exit, with the module half gone
                pass


def dump_call(obj: Any, base: type[Any], collector: type[list[Any]]) -> Buffers | None:
    """``obj`` pickled with its large payloads copied into a segment: ``[envelope, stream
    parts...]``; or None if no segment can be had (the caller uses the pipe)."""
    payloads: list[tuple[memoryview, int]] = []
    stream = collector()
    _pickler(base)(stream, payloads).dump(obj)
    if not payloads:  # large, but not a buffer (a long str): the stream carries it
        return list(stream)
    offsets, end = _layout(payloads, _CALL_HEADER)
    segment = cache.take(end) if openable() else None
    if segment is None:
        return None
    try:
        target = segment.writable()
        target[0] = 0  # not kept (it may have been, by a worker that has since died)
        for (view, _), offset in zip(payloads, offsets):
            target[offset:offset + view.nbytes] = view
        ref = SharedRef(_envelope(os.getpid(), segment.fd, segment.ino, 0, payloads,
                                  offsets))
    except OSError:  # no address space to map it (a memory limit): the pipe, then
        cache.give_back(segment)
        return None
    except BaseException:
        cache.give_back(segment)
        raise
    ref.segment = segment
    return [ref, *stream]


ENVELOPE_HEAD = _ENVELOPE.size  # enough of an envelope to know its length


def retire(body: Buffers) -> None:
    """Never reuse the segment of this call's body: a process other than its worker may
    still view it (the worker was not reaped, or left processes in its group)."""
    for part in body:
        if type(part) is SharedRef:
            part.segment.retired = True


def envelope_length(data: Any) -> int:
    """The length of the envelope at the start of ``data`` (a call's, after its function)."""
    count: int = struct.unpack_from("!I", data, _ENVELOPE.size - 4)[0]
    return _ENVELOPE.size + count * _PAYLOAD.size


def _extent(payloads: list[tuple[int, int, int]]) -> int:
    """Where the last payload ends, rounded up to a page: what is mapped of a segment."""
    end = max(offset + length for offset, length, _ in payloads)
    return -(-end // mmap.PAGESIZE) * mmap.PAGESIZE


class CallView:
    """The worker's view of a call's segment, from the envelope the call came with."""

    def __init__(self, envelope: Any) -> None:
        global current_call
        (pid, fd, ino, _), self._payloads, _ = _read_envelope(envelope)
        self._fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            status = os.fstat(self._fd)
            if status.st_ino != ino:
                raise OSError(f"descriptor {fd} of pid {pid} is no longer the call's segment")
            if _extent(self._payloads) > status.st_size:
                raise OSError(f"the call's segment holds {status.st_size} bytes, fewer "
                              f"than its payloads")
            extent = _buffers_extent(self._payloads)
            self._map = (mmap.mmap(self._fd, extent, flags=_MAP_FLAGS) if extent
                         else None)
        except BaseException:
            os.close(self._fd)
            raise
        self._views = _views(self._map, self._payloads)
        current_call = self

    def load(self, stream: Any) -> Any:
        return _load(stream, self._fd, self._payloads, self._views)

    def mark_kept(self) -> None:
        """Never to be reused: another process, or an object of the task's, may view it.
        Written at once, so it holds even if this worker is killed before it replies."""
        if self._map is not None and not self._map.closed:
            self._map[0] = 1

    def release(self) -> None:
        """Close the view, once the task and its result let go of the arguments. If the
        task kept one (an array stored in a global), or forked a process that may still
        view them, the segment is marked kept, and the parent never reuses it: the view
        holds its memory until the objects that use it are gone."""
        global current_call
        current_call = None
        os.close(self._fd)
        # Dropped, not released: an unpickled object may hold one of them itself (a
        # buffer protocol 5 handed over as it is), and would find it dead.
        self._views = []
        if self._map is None:  # bytes only: read out, nothing views the segment
            return
        try:
            self._map.close()
        except BufferError:
            import gc
            gc.collect()  # what a cycle in the task's garbage held (a traceback, say)
            try:
                self._map.close()
            except BufferError:
                # Kept: marked so, and left to close itself with the last object that
                # views it.
                self.mark_kept()


current_call: CallView | None = None  # the call the worker runs, if it has a segment


# --- results: the parent lends, the worker writes, the parent views -----------------------

class LoanDesk:
    """The parent's side of one worker's loans: the segment lent to it for its next large
    result, and the desk (a ``memfd`` of 16 bytes) through which the worker learns which it
    is: ``generation << 32 | descriptor``, then its inode. The dispatcher thread alone
    uses it."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("pool-desk")
        os.ftruncate(self.fd, _DESK.size)
        self.loan: Segment | None = None
        self.generation = 0
        self._hint = 0  # the size of the worker's last large result

    def fds(self) -> list[int]:
        """Its own: the loan is a segment, which a forked child closes with the others
        (``SegmentCache.close_in_child``), once."""
        return [self.fd]

    def lend(self) -> None:
        """Lend the worker a segment for its next large result, if it has none: an idle
        one not much larger than its last large result, or a new one, empty until the
        worker grows it (so an idle worker holds no memory it did not ask for). None if
        this process may not have more: its results go through the pipe until the next."""
        if self.loan is None:
            self._hand_over(cache.take(self._hint, most=2 * self._hint + _STEP))

    def take_back(self) -> None:
        """The worker has nothing in flight (so it is not writing into its loan: it reads
        its desk only as it replies): if its loan holds memory, it gets an empty one in
        its place, and the memory goes back to the cache, to be reused or returned to the
        system in time."""
        loan = self.loan
        if loan is not None and loan.size:
            self.loan = None
            cache.give_back(loan)
            self._hand_over(cache.take(0, most=0))

    def _hand_over(self, loan: Segment | None) -> None:
        self.loan = loan
        if loan is not None:
            self.generation += 1
            os.pwrite(self.fd, _DESK.pack(self.generation << 32 | loan.fd, loan.ino), 0)

    def load_result(self, body: Any) -> Any:
        """Unpickle a result whose payloads are in the segment lent to this worker, which
        then has none until ``lend``. Raises MalformedFrame if it is not that segment, or
        its payloads lie where the worker never wrote."""
        data = memoryview(body)[len(MARKER):]
        loan = self.loan
        if loan is None:
            raise MalformedFrame("a result in a segment, with none lent")
        size = os.fstat(loan.fd).st_size
        (_, fd, ino, generation), payloads, start = _read_envelope(data, size)
        if (fd, ino, generation) != (loan.fd, loan.ino, self.generation):
            raise MalformedFrame(f"a result in segment {fd} (generation {generation}), "
                                 f"not the one lent ({loan.fd}, {self.generation})")
        extent = _extent(payloads)
        # A hole: pages never written, which mapping would make this process allocate.
        if os.lseek(loan.fd, 0, os.SEEK_HOLE) < min(extent, size):
            raise MalformedFrame(f"a result whose {extent} bytes were never all written")
        self.loan = None
        loan.size = size
        self._hint = extent
        if loan.view is not None:  # it may have grown: mapped again when next written
            loan.view.close()
            loan.view = None
        mapped = _buffers_extent(payloads)
        try:
            view = mmap.mmap(loan.fd, mapped, flags=_MAP_FLAGS) if mapped else None
        except OSError as exc:  # no address space for it: as a reply with no memory
            cache.give_back(loan)
            raise NoRoom(f"no memory for a reply of {extent} bytes "
                         f"({type(exc).__name__}: {exc})") from None
        try:
            return _load(data[start:], loan.fd, payloads, _views(view, payloads))
        except MemoryError as exc:  # a bytes payload this process has no room for
            raise NoRoom(f"no memory for a reply of {extent} bytes "
                         f"({type(exc).__name__}: {exc})") from None
        finally:
            if view is None:
                cache.give_back(loan)  # read out: nothing views it
            else:
                cache.give_back_when_unviewed(loan, view)

    def close(self, *, worker_gone: bool) -> None:
        """The worker has exited (``worker_gone``: its views went with it, so the loan can
        be reused) or was abandoned (it may still map the loan: it is let go)."""
        if self.loan is not None:
            if not worker_gone:
                self.loan.retired = True  # never reused
            self.loan.size = max(self.loan.size, os.fstat(self.loan.fd).st_size)
            cache.give_back(self.loan)
            self.loan = None
        os.close(self.fd)
        self.fd = -1


_DESK = struct.Struct("=QQ")  # generation << 32 | descriptor, inode


class WorkerDesk:
    """The worker's side of its loans: reads which segment it may write a result into."""

    def __init__(self, parent_pid: int, desk_fd: int) -> None:
        self.parent_pid, self._desk_fd = parent_pid, desk_fd
        self._fd: int | None = None
        self._used = 0  # the generation of the loan last written into
        self._broken = False

    def loan(self) -> tuple[int, int, int] | None:
        """``(generation, descriptor in the parent, inode)`` of an unused loan, or None."""
        if self._broken:
            return None
        if self._fd is None:
            try:
                self._fd = os.open(f"/proc/{self.parent_pid}/fd/{self._desk_fd}", os.O_RDONLY)
            except OSError:
                self._broken = True  # the parent's descriptors are not ours to open
                return None
        word, ino = _DESK.unpack(os.pread(self._fd, _DESK.size, 0))
        generation = word >> 32
        if generation == 0 or generation == self._used:
            return None
        return generation, word & 0xFFFFFFFF, ino

    def dump_result(self, value: Any, collector: type[list[Any]]) -> Buffers | None:
        """``value`` pickled with its large payloads written into the loan: ``[MARKER and
        envelope, stream parts...]``; None if there is no loan to write into."""
        loan = self.loan()
        if loan is None:
            return None
        generation, fd, ino = loan
        payloads: list[tuple[memoryview, int]] = []
        stream = collector()
        _pickler(pickle.Pickler)(stream, payloads).dump(value)
        if not payloads:
            return list(stream)
        offsets, end = _layout(payloads, 0)
        try:
            target = os.open(f"/proc/{self.parent_pid}/fd/{fd}", os.O_RDWR)
        except OSError:
            return None
        try:
            status = os.fstat(target)
            if status.st_ino != ino:  # not the loan (the desk was read as it changed)
                return None
            if status.st_size < end:
                os.ftruncate(target, -(-end // _STEP) * _STEP)
            for (payload, _), offset in zip(payloads, offsets):
                _write(target, offset, payload)
        finally:
            os.close(target)
        self._used = generation
        return [MARKER + _envelope(0, fd, status.st_ino, generation, payloads, offsets),
                *stream]


worker_desk: WorkerDesk | None = None  # set as a worker starts, if its parent lends

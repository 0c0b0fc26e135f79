"""Frames: the wire format between the parent and a worker, and reading and writing it.

Owns: the frame layout, the blocking writers (the dispatcher's writes and the worker's
replies), the worker's blocking ``FrameStream`` and the dispatcher's non-blocking
``FrameReader``.
Runs in: the dispatcher thread (``FrameReader``, writes), its large-frame writer threads
(``write_all``) and the worker (``FrameStream``, ``write_frame``).
Guarantees: the parent never blocks reading a worker: ``FrameReader`` only reads what is
there. Bytes that are not a frame are reported as an error, never trusted. A length in a
header is never believed beyond the machine's memory. A reply this process has no memory
for is read to its end and thrown away (``Unreceivable``): it fails its task alone.
Assumes: each pipe has one writer (the worker or the dispatcher), so frames never interleave.

A frame is a fixed header -- magic, kind, task id, body length -- and then the body::

    b"\\xb7P" | kind: u8 | task_id: u64 | length: u64 | body (length bytes)
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
from typing import Any, NamedTuple

MAGIC = b"\xb7P"
HEADER = struct.Struct("!2sBQQ")
# A body larger than this is garbage, not a reply (it would not fit in memory anyway).
MAX_BODY = 1 << 40
# Bodies up to this size are parsed out of the read buffer; larger ones get their own
# preallocated buffer that the pipe is read into directly.
_SMALL_BODY = 1 << 16
_READ_CHUNK = 1 << 16

# An encoded body: the pickler's own pieces, and large ``bytes`` payloads by reference, so a
# 64 MiB argument is never copied in user space on its way into the pipe.
Buffers = list[bytes | memoryview]



class Kind(enum.IntEnum):
    """What a frame carries. ``CALL`` goes to a worker; every other kind comes back."""

    CALL = 1          # body: encode_call(...)
    READY = 2         # the worker is up and its initializer succeeded; empty body
    RESULT = 3        # body: the pickled return value
    RAISED = 4        # body: encode_exception(...); also when the return value did not pickle
    INIT_FAILED = 6   # body: encode_exception(...) of the initializer's exception
    OVER_MEMORY = 7   # body: resident bytes, as u64; sent just before the reply it follows


# Kind by its byte, looked up per frame: Kind(byte) costs a microsecond, a dict 30 ns.
_KIND_OF = {kind.value: kind for kind in Kind}


class MalformedFrame(Exception):
    """A frame's header was valid but its body is not what its kind promises."""


class Unreceivable(NamedTuple):
    """The body of a reply the parent had no memory for. It was read to its end and thrown
    away; its task alone fails. The worker did nothing wrong, and goes on."""
    length: int
    why: str


class Frame(NamedTuple):
    kind: Kind
    task_id: int
    body: Any  # bytes-like; a BodyReader for a large frame read by FrameStream


# --- blocking frame I/O (worker side, and the dispatcher's writes) -----------------------

def write_all(fd: int, parts: list[Any]) -> None:
    """Writes every part (bytes-like), blocking. If BrokenPipeError is raised, ``parts``
    holds what was not written; its first item may be the rest of a part."""
    while parts:
        _drop_written(parts, os.writev(fd, parts[:1024]))  # IOV_MAX


def _drop_written(parts: list[Any], written: int) -> None:
    """Takes the first ``written`` bytes off ``parts``; the last may be cut in two."""
    while parts and written >= len(parts[0]):
        written -= len(parts[0])
        parts.pop(0)
    if parts and written:
        parts[0] = memoryview(parts[0])[written:]


def size_of(body: bytes | Buffers) -> int:
    return len(body) if isinstance(body, bytes) else sum(map(len, body))


def write_frame(fd: int, kind: Kind, task_id: int, body: bytes | Buffers = b"") -> None:
    """Write one whole frame, blocking until it is all in the pipe."""
    parts: Buffers = [body] if isinstance(body, bytes) else body
    write_all(fd, [HEADER.pack(MAGIC, kind, task_id, size_of(parts)), *parts])


def write_frames(fd: int, kind: Kind, frames: list[tuple[int, Buffers]]) -> int:
    """Writes several frames with as few system calls as the pipe allows. Returns how many
    were written whole: fewer only if the reader went away (BrokenPipeError is caught)."""
    if len(frames) == 1 and len(frames[0][1]) < 1023:  # the usual case: one writev
        task_id, body = frames[0]
        length = size_of(body)
        pieces = [HEADER.pack(MAGIC, kind, task_id, length), *body]
        try:
            written = os.writev(fd, pieces)
            if written == HEADER.size + length:
                return 1
            _drop_written(pieces, written)  # a short write: the rest, blocking
            write_all(fd, pieces)
        except BrokenPipeError:
            return 0
        return 1
    parts: list[Any] = []
    ends = []  # for each frame, how many parts there are up to its end
    for task_id, body in frames:
        parts.append(HEADER.pack(MAGIC, kind, task_id, size_of(body)))
        parts += body
        ends.append(len(parts))
    total = len(parts)
    try:
        write_all(fd, parts)
    except BrokenPipeError:
        pass
    written_parts = total - len(parts)  # the first part left may be written in part
    return sum(1 for end in ends if end <= written_parts)


def _kind(value: int) -> Kind:
    kind = _KIND_OF.get(value)
    if kind is None:
        raise ValueError(f"{value} is not a frame kind")
    return kind


class FrameStream:
    """The worker's blocking frame reader. From a packet-mode pipe each read takes one
    frame, so the frames behind it stay in the pipe, where the parent can take them back.
    From a plain pipe, one read takes what is there. A large body is not read here: the
    frame carries a ``BodyReader``. Unpickling from it reads large byte strings straight
    from the pipe into the objects the unpickler makes, with no buffer in between."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def next(self) -> Frame | None:
        """The next frame; None at end of file between frames. A large frame's body must be
        read to its end (``BodyReader.skip_rest``) before the next call."""
        if not self._fill(HEADER.size):
            if self._buffer:
                raise EOFError("pipe closed inside a frame header")
            return None
        magic, kind, task_id, length = HEADER.unpack_from(self._buffer)
        if magic != MAGIC or length > MAX_BODY:
            raise ValueError(f"not a pool frame: header {bytes(self._buffer[:HEADER.size])!r}")
        del self._buffer[:HEADER.size]
        if length > _SMALL_BODY:
            return Frame(_kind(kind), task_id, BodyReader(self, length))
        if not self._fill(length):
            raise EOFError(f"pipe closed after {len(self._buffer)} of {length} body bytes")
        body = self._buffer[:length]
        del self._buffer[:length]
        return Frame(_kind(kind), task_id, body)

    def _fill(self, count: int) -> bool:
        """Read until the buffer holds ``count`` bytes; False at end of file before that."""
        while len(self._buffer) < count:
            chunk = os.read(self.fd, max(_READ_CHUNK, count - len(self._buffer)))
            if not chunk:
                return False
            self._buffer += chunk
        return True

    def _take(self, count: int) -> bytes:
        self._fill(count)
        with memoryview(self._buffer) as view:
            data = bytes(view[:count])
        del self._buffer[:count]
        return data

    def _take_into(self, view: memoryview) -> int:
        have = min(len(self._buffer), len(view))
        view[:have] = self._buffer[:have]
        del self._buffer[:have]
        while have < len(view):
            count = os.readv(self.fd, [view[have:]])
            if count == 0:
                break
            have += count
        return have


class BodyReader:
    """A large frame body, still in the pipe, read as a binary file. ``pickle.load`` reads
    a large byte string with ``readinto``, straight into the bytes object it returns."""

    def __init__(self, stream: FrameStream, length: int) -> None:
        self._stream = stream
        self.length = length
        self.remaining = length

    def __len__(self) -> int:
        return self.length

    def read(self, count: int = -1) -> bytes:
        count = self.remaining if count < 0 else min(count, self.remaining)
        data = self._stream._take(count)
        self.remaining -= len(data)
        return data

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        count = self._stream._take_into(view[:min(len(view), self.remaining)])
        self.remaining -= count
        return count

    def readline(self) -> bytes:  # only protocol 0 needs it; here it reads to the end
        return self.read()

    def skip_rest(self) -> None:
        """Read and drop what is left of the body, so the next frame can be read."""
        while self.remaining:
            if not self.read(min(self.remaining, 1 << 20)):
                raise EOFError(f"pipe closed with {self.remaining} body bytes unread")


# --- non-blocking frame reader (dispatcher side) ----------------------------------------

class FrameReader:
    """Parses the frames a worker sends, reading only what the pipe already holds.

    ``fd`` must be non-blocking. After ``read_available()``, ``eof`` tells that the worker
    closed its end, and ``error`` (a string) that it sent bytes that are not a frame; a
    reader with an error reads nothing more.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.eof = False
        self.error: str | None = None
        self._buffer = bytearray()
        self._large: tuple[int, int, mmap.mmap] | None = None  # kind, task_id, body
        self._large_filled = 0
        # A reply being thrown away (``Unreceivable``): kind, task_id, bytes left, why.
        self._discarding: tuple[int, int, int, Unreceivable] | None = None
        self._scratch: bytearray | None = None  # what it is read into

    def read_available(self) -> list[Frame]:
        frames: list[Frame] = []
        while not (self.eof or self.error):
            try:
                if self._large is not None:
                    self._read_large(frames)
                    continue
                if self._discarding is not None:
                    self._discard(frames)
                    continue
                chunk = os.read(self.fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self._buffer += chunk
            self._parse(frames)
            if len(chunk) < _READ_CHUNK and self._large is None and self._discarding is None:
                break  # the pipe is empty for now: the next wait() says when it is not
        return frames

    def _discard(self, frames: list[Frame]) -> None:
        assert self._discarding is not None
        kind, task_id, left, body = self._discarding
        # One buffer for the whole frame: little is allocated while memory is short.
        try:
            if self._scratch is None:
                self._scratch = bytearray(_READ_CHUNK)
        except MemoryError:
            self.error = f"a frame of {body.length} bytes, more than memory can hold"
            return
        count = os.readv(self.fd, [memoryview(self._scratch)[:min(left, _READ_CHUNK)]])
        if count == 0:
            self.eof = True
            return
        if count < left:
            self._discarding = (kind, task_id, left - count, body)
        else:
            self._discarding = None
            frames.append(Frame(_KIND_OF[kind], task_id, body))

    def _read_large(self, frames: list[Frame]) -> None:
        assert self._large is not None
        kind, task_id, body = self._large
        count = os.readv(self.fd, [memoryview(body)[self._large_filled:]])
        if count == 0:
            self.eof = True
            return
        self._large_filled += count
        if self._large_filled == len(body):
            self._large = None
            frames.append(Frame(_KIND_OF[kind], task_id, body))

    def _parse(self, frames: list[Frame]) -> None:
        buf = self._buffer
        start = 0
        while len(buf) - start >= HEADER.size:
            magic, kind, task_id, length = HEADER.unpack_from(buf, start)
            if magic != MAGIC or length > MAX_BODY or kind not in _KINDS_FROM_WORKER:
                self.error = (f"bytes that are not a reply frame: "
                              f"{bytes(buf[start:start + 32])!r}")
                return
            body_start = start + HEADER.size
            if length > _SMALL_BODY and len(buf) - body_start < length:
                try:
                    if length > _PHYSICAL_MEMORY:  # mmap might promise it all the same
                        raise MemoryError
                    # Anonymous memory: the kernel zeroes each page as the pipe fills it,
                    # where bytearray(length) would first write every byte itself.
                    body = mmap.mmap(-1, length)
                except (MemoryError, OSError) as exc:
                    if length > _PHYSICAL_MEMORY or kind not in _OUTCOME_KINDS:
                        self.error = f"a frame of {length} bytes, more than memory can hold"
                        return
                    # A reply the machine could hold, but this process has no memory for
                    # now (a memory limit, or the machine is full).
                    have = len(buf) - body_start
                    self._discarding = (kind, task_id, length - have, Unreceivable(
                        length, f"no memory for a reply of {length} bytes "
                                f"({type(exc).__name__}: {exc})"))
                    start = len(buf)
                    break
                have = len(buf) - body_start
                body[:have] = buf[body_start:]
                self._large, self._large_filled = (kind, task_id, body), have
                start = len(buf)
                break
            if len(buf) - body_start < length:
                break
            frames.append(Frame(_KIND_OF[kind], task_id,
                                bytes(buf[body_start:body_start + length])))
            start = body_start + length
        del buf[:start]


_KINDS_FROM_WORKER = frozenset(k.value for k in Kind if k is not Kind.CALL)
_OUTCOME_KINDS = frozenset({Kind.RESULT.value, Kind.RAISED.value})


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return MAX_BODY


_PHYSICAL_MEMORY = _physical_memory()

"""Large payloads out of the pickle stream: which they are, how they are laid out in a
segment, the envelope that says where each lies, and reading them back.

Owns: the envelope's format, the pickler that collects payloads (``pickler_for``) and
the unpickler that takes them back (``load``).
Runs in: wherever a call or a result is pickled or unpickled (callers' threads, the
dispatcher thread, the worker).
Guarantees: every payload of at least ``segments.SHARED_ABOVE`` bytes is collected:
protocol 5 buffers (arrays) through ``buffer_callback``, ``bytes`` and ``bytearray`` as
persistent ids, each object once (it arrives as one object). An envelope is checked
before it is trusted: one that cannot be, or points past its segment, is
``MalformedFrame``. A buffer arrives as a view of the segment; ``bytes`` and ``bytearray``
are read out of it, since they own their memory.
Assumes: the segment holds what the envelope says, written before the envelope was sent.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
from typing import Any

from .frames import MalformedFrame
from .segments import SHARED_ABOVE

MARKER = b"S"  # the first byte of a result body whose payloads are in a segment
# The envelope: pid and descriptor of the segment in the process that owns it, its inode
# (which segment it is), the loan's generation (0 for a call), the number of payloads.
_ENVELOPE = struct.Struct("!IIQQI")
_PAYLOAD = struct.Struct("!QQB")  # offset, length, kind
BUFFER, BYTES, BYTEARRAY = 0, 1, 2
_ALIGN = 64  # every payload starts on this boundary (any dtype's alignment)

_made: dict[type[Any], type[Any]] = {}


def pickler_for(base: type[Any]) -> type[Any]:
    """``base`` (the stdlib's pickler or the by-value one), collecting every payload of at
    least ``SHARED_ABOVE`` bytes out of the stream: protocol 5 buffers (arrays) through
    ``buffer_callback``, ``bytes`` and ``bytearray`` as persistent ids."""
    made = _made.get(base)
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
                        self._payloads.append((memoryview(obj), BYTES if cls is bytes
                                               else BYTEARRAY))
                        index = self._index_of[id(obj)] = len(self._payloads) - 1
                    return index
                return None

        made = _made[base] = SegmentPickler
    return made


def _out_of_band(payloads: list[tuple[memoryview, int]]) -> Any:
    def buffer_callback(buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # neither C- nor Fortran-contiguous: in the stream
            return True
        if view.nbytes < SHARED_ABOVE:
            return True
        payloads.append((view, BUFFER))
        return False
    return buffer_callback


def layout(payloads: list[tuple[memoryview, int]], start: int) -> tuple[list[int], int]:
    offsets = []
    end = start
    for view, _ in payloads:
        end = -(-end // _ALIGN) * _ALIGN
        offsets.append(end)
        end += view.nbytes
    return offsets, end


def envelope(pid: int, fd: int, ino: int, generation: int,
              payloads: list[tuple[memoryview, int]], offsets: list[int]) -> bytes:
    table = b"".join(_PAYLOAD.pack(offset, view.nbytes, kind)
                     for (view, kind), offset in zip(payloads, offsets))
    return _ENVELOPE.pack(pid, fd, ino, generation, len(payloads)) + table


def read_envelope(data: Any, limit: int | None = None
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
        if kind > BYTEARRAY or (limit is not None and offset + length > limit):
            raise MalformedFrame(f"a payload at {offset} of {length} bytes (kind {kind}) "
                                 f"in a segment of {limit} bytes")
    return (pid, fd, ino, generation), payloads, end


def load(stream: Any, fd: int, payloads: list[tuple[int, int, int]],
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
        if kind == BUFFER:
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
    if kind == BYTES and length <= _MOST_PER_CALL:
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
    return target if kind == BYTEARRAY else bytes(target)


def write(fd: int, offset: int, payload: memoryview) -> None:
    done, length = 0, payload.nbytes
    while done < length:
        done += os.pwritev(fd, [payload[done:done + _MOST_PER_CALL]], offset + done)


def buffers_extent(payloads: list[tuple[int, int, int]]) -> int:
    """What must be mapped of a segment: up to its last buffer payload's end, rounded up
    to a page (0: none, so nothing is mapped: ``bytes`` are read)."""
    buffers = [p for p in payloads if p[2] == BUFFER]
    return extent(buffers) if buffers else 0


def views_of(mapping: mmap.mmap | None, payloads: list[tuple[int, int, int]]
           ) -> list[memoryview | None]:
    if mapping is None:
        return [None] * len(payloads)
    whole = memoryview(mapping)
    views = [whole[offset:offset + length] if kind == BUFFER else None
             for offset, length, kind in payloads]
    whole.release()
    return views


def extent(payloads: list[tuple[int, int, int]]) -> int:
    """Where the last payload ends, rounded up to a page: what is mapped of a segment."""
    end = max(offset + length for offset, length, _ in payloads)
    return -(-end // mmap.PAGESIZE) * mmap.PAGESIZE


ENVELOPE_HEAD = _ENVELOPE.size  # enough of an envelope to know its length


def envelope_length(data: Any) -> int:
    """The length of the envelope at the start of ``data`` (a call's, after its function)."""
    count: int = struct.unpack_from("!I", data, _ENVELOPE.size - 4)[0]
    return _ENVELOPE.size + count * _PAYLOAD.size

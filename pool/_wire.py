"""The wire protocol between the parent and a worker, and how calls and outcomes are pickled.

Owns: frame layout, the frame reader the dispatcher uses, and the (de)serialisation of calls,
results and exceptions.
Runs in: callers' threads (pickling a call), the dispatcher thread (``FrameReader``, decoding
replies) and the worker (everything else).
Guarantees: the parent never blocks reading a worker (``FrameReader`` only reads what is
there); bytes that are not a frame are reported as an error, never trusted; anything that
fails to pickle or unpickle becomes a per-task error that names what failed.
Assumes: each pipe has one writer (the worker or the dispatcher), so frames never interleave.

A frame is a fixed header -- magic, kind, task id, body length -- and then the body::

    b"\\xb7P" | kind: u8 | task_id: u64 | length: u64 | body (length bytes)
"""

from __future__ import annotations

import enum
import io
import mmap
import os
import pickle
import struct
import sys
import threading
import traceback
import types
from typing import Any, Callable, Iterator, NamedTuple

import cloudpickle
from tblib import pickling_support

try:
    import fcntl
    _SETPIPE: int | None = fcntl.F_SETPIPE_SZ  # Linux only
    _GETPIPE: int = fcntl.F_GETPIPE_SZ
except (ImportError, AttributeError):
    _SETPIPE = None

from ._errors import (ArgumentPicklingError, RemoteTaskError, ResultTransferError,
                      argument_pickling_error,
                      callable_name)

PROTOCOL = 5
MAGIC = b"\xb7P"
HEADER = struct.Struct("!2sBQQ")
_FN_LENGTH = struct.Struct("!I")
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
    RAISED = 4        # body: encode_exception(...) (also: the return value did not pickle)
    INIT_FAILED = 6   # body: encode_exception(...) of the initializer's exception
    OVER_MEMORY = 7   # body: resident bytes, as u64; sent just before the reply it follows


class MalformedFrame(Exception):
    """A frame's header was valid but its body is not what its kind promises."""


class Frame(NamedTuple):
    kind: Kind
    task_id: int
    body: Any  # bytes-like; a BodyReader for a large frame read by FrameStream


# --- blocking frame I/O (worker side, and the dispatcher's writes) -----------------------

def _write_all(fd: int, parts: list[Any]) -> None:
    """Write every part (bytes-like), blocking. If BrokenPipeError is raised, ``parts``
    holds what was not written (the first of them perhaps in part)."""
    while parts:
        written = os.writev(fd, parts[:1024])  # IOV_MAX
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
    _write_all(fd, [HEADER.pack(MAGIC, kind, task_id, size_of(parts)), *parts])


def write_frames(fd: int, kind: Kind, frames: list[tuple[int, Buffers]]) -> int:
    """Write several frames with as few system calls as the pipe allows; returns how many
    were written whole (fewer only if the reader went away: BrokenPipeError is caught)."""
    parts: list[Any] = []
    ends = []  # for each frame, how many parts there are up to its end
    for task_id, body in frames:
        parts.append(HEADER.pack(MAGIC, kind, task_id, size_of(body)))
        parts += body
        ends.append(len(parts))
    total = len(parts)
    try:
        _write_all(fd, parts)
    except BrokenPipeError:
        pass
    written_parts = total - len(parts)  # the first part left may be written in part
    return sum(1 for end in ends if end <= written_parts)


# Linux's atomic pipe write, and the size of a packet in a packet-mode pipe.
PIPE_BUF = 4096
# Frames this small travel as one packet (see ``set_packet_mode``).
PACKET_BODY = PIPE_BUF - HEADER.size


def set_packet_mode(fd: int, on: bool) -> bool:
    """Turn packet mode (``O_DIRECT``, Linux 3.4+) on or off for writes through ``fd``.

    In packet mode every write of at most PIPE_BUF bytes stays one packet, and a read takes
    at most one packet. So when a frame is one write, each read takes exactly one frame,
    and a second reader (the parent, holding a read end of a worker's task pipe) can take
    back the frames the worker has not read without ever splitting one. Returns False where
    pipes have no packet mode.
    """
    direct = getattr(os, "O_DIRECT", None)
    if direct is None or _SETPIPE is None:  # not Linux
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | direct) if on else (flags & ~direct))
    except OSError:
        return False
    return True


def second_reader(read_fd: int) -> int | None:
    """A non-blocking read end of the same pipe that does not make ``read_fd`` non-blocking
    (as a dup would: the flag belongs to the open file, which dups share): the pipe is
    opened again through /proc. None where that is not possible."""
    try:
        return os.open(f"/proc/self/fd/{read_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def pipe_capacity(fd: int) -> int | None:
    """The pipe's size in bytes, where it can be known (Linux)."""
    if _SETPIPE is None:
        return None
    try:
        return int(fcntl.fcntl(fd, _GETPIPE))
    except OSError:
        return None


def read_packets(fd: int) -> list[tuple[int, int]]:
    """Take every packet waiting in a packet-mode pipe (``fd`` non-blocking) as
    ``(kind, task_id)``; each must be one whole frame."""
    taken: list[tuple[int, int]] = []
    while True:
        try:
            packet = os.read(fd, PIPE_BUF)
        except BlockingIOError:
            return taken
        if not packet:
            return taken
        magic, kind, task_id, length = HEADER.unpack_from(packet)
        if magic != MAGIC or len(packet) != HEADER.size + length:
            raise AssertionError(f"a packet that is not one frame: {packet[:32]!r}")
        taken.append((kind, task_id))


class PipeRoom:
    """Makes a pipe roomier while large frames go through it, and gives the room back.

    Through Linux's default 64 KiB pipe a large frame moves as a ping-pong of 64 KiB pieces,
    two context switches each; with 1 MiB of room it moves about three times as fast
    (measured here: ~1.0 GB/s -> ~3.0 GB/s between two processes). The room counts against
    the user's ``pipe-user-pages-soft`` (64 MiB by default, shared by all their processes),
    so a pipe keeps it only while frames larger than ``LARGE_FRAME`` go through, and is
    shrunk back before the next small frame (if the reader has emptied it by then).
    Elsewhere than Linux this does nothing.
    """

    LARGE_FRAME = 256 << 10
    ROOM = 1 << 20

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._usual: int | None = None  # the pipe's size before it grew; None: not grown

    def fit(self, frame_bytes: int) -> None:
        """Call before writing ``frame_bytes`` (a frame, or several at once)."""
        if frame_bytes > self.LARGE_FRAME:
            usual = pipe_capacity(self.fd) if self._usual is None else None
            if usual is not None and usual < self.ROOM:
                assert _SETPIPE is not None  # pipe_capacity knew the size: Linux
                try:
                    fcntl.fcntl(self.fd, _SETPIPE, self.ROOM)
                    self._usual = usual
                except OSError:
                    pass  # over the user's limit, or above pipe-max-size: stay as it is
        elif self._usual is not None and _SETPIPE is not None:
            try:
                fcntl.fcntl(self.fd, _SETPIPE, self._usual)
                self._usual = None
            except OSError:
                pass  # EBUSY: it still holds more than that; try again next time


class FrameStream:
    """Blocking frame reader for the worker. From a packet-mode pipe each read takes one
    frame, so the frames behind it stay in the pipe, where the parent can take them back;
    from a plain pipe, one read takes what is there. A large body is not read here: the
    frame carries a ``BodyReader``, so that unpickling it reads large byte strings straight
    from the pipe into the objects the unpickler makes (no buffer in between)."""

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
            return Frame(Kind(kind), task_id, BodyReader(self, length))
        if not self._fill(length):
            raise EOFError(f"pipe closed after {len(self._buffer)} of {length} body bytes")
        body = self._buffer[:length]
        del self._buffer[:length]
        return Frame(Kind(kind), task_id, body)

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
    """A large frame body, still in the pipe, read as a binary file (``pickle.load`` reads
    a large byte string with ``readinto`` into the bytes object it will return)."""

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

    def read_available(self) -> list[Frame]:
        frames: list[Frame] = []
        while not (self.eof or self.error):
            try:
                if self._large is not None:
                    self._read_large(frames)
                    continue
                chunk = os.read(self.fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self._buffer += chunk
            self._parse(frames)
        return frames

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
            frames.append(Frame(Kind(kind), task_id, body))

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
                except (MemoryError, OSError):
                    self.error = f"a frame of {length} bytes, more than memory can hold"
                    return
                have = len(buf) - body_start
                body[:have] = buf[body_start:]
                self._large, self._large_filled = (kind, task_id, body), have
                start = len(buf)
                break
            if len(buf) - body_start < length:
                break
            frames.append(Frame(Kind(kind), task_id, bytes(buf[body_start:body_start + length])))
            start = body_start + length
        del buf[:start]


_KINDS_FROM_WORKER = frozenset(k.value for k in Kind if k is not Kind.CALL)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return MAX_BODY


_PHYSICAL_MEMORY = _physical_memory()


# --- calls ---------------------------------------------------------------------------------

def dumps_callable(fn: Callable[..., Any]) -> bytes:
    """Pickle a task's function: by reference when workers can import it, else by value.

    By reference keeps one copy of each class and the real file names in tracebacks.
    Lambdas, closures and functions of a ``__main__`` that workers cannot import (``python
    -c``, a REPL, a notebook) go by value with cloudpickle, so they work under spawn and
    forkserver too.
    """
    if getattr(fn, "__module__", None) != "__main__" or _main_importable_by_workers():
        try:
            return pickle.dumps(fn, PROTOCOL)
        except KeyboardInterrupt:
            raise
        except BaseException:
            pass  # a lambda or closure: fall through to pickling by value
    try:
        return bytes(cloudpickle.dumps(_KeepFilename.wrap(fn), PROTOCOL))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a reducer's SystemExit too: it fails this call only
        raise argument_pickling_error(
            f"cannot pickle the function {callable_name(fn)}: {type(exc).__name__}: {exc}",
            exc) from exc


def _main_importable_by_workers() -> bool:
    # multiprocessing re-imports a main script (or ``-m`` module) in spawn and forkserver
    # children as ``__mp_main__``; a forked child has it already.
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None or getattr(main, "__spec__", None) is not None


class _KeepFilename:
    """A function pickled by value that gets its real file name back when unpickled.

    cloudpickle (3.1+) names the code of every function it pickles by value
    ``<dynamic-code>``; remote tracebacks should point at the user's file instead.
    """

    def __init__(self, fn: Any, filename: str) -> None:
        self.fn, self.filename = fn, filename

    @classmethod
    def wrap(cls, fn: Any) -> Any:
        code = getattr(fn, "__code__", None)
        return cls(fn, code.co_filename) if isinstance(code, types.CodeType) else fn

    def __reduce__(self) -> tuple[Any, ...]:
        return (_with_filename, (self.fn, self.filename))


def _with_filename(fn: Any, filename: str) -> Any:
    try:
        fn.__code__ = _renamed_code(fn.__code__, filename)
    except (AttributeError, TypeError, ValueError):
        pass  # cosmetic only
    return fn


def _renamed_code(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed_code(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


class _Snapshot(list):  # type: ignore[type-arg]
    """Collects what a pickler writes. The pickler hands large payloads over by reference
    instead of copying them into its stream; ``bytes`` are kept as they are (immutable),
    anything else is copied, so that a caller changing a bytearray after submit() does not
    change what the task receives."""

    def write(self, data: Any) -> None:
        # tobytes("A"): the memory as it is laid out (a Fortran-order array stays one).
        self.append(data if type(data) is bytes else memoryview(data).tobytes("A"))


class _Borrow(list):  # type: ignore[type-arg]
    """Collects what a pickler writes, payloads by reference: for a value written at once."""

    def write(self, data: Any) -> None:
        if type(data) is not bytes:  # a bytearray or a buffer: as flat bytes, for writev
            view = memoryview(data)
            data = view.cast("B") if view.c_contiguous else view.tobytes("A")
        self.append(data)


def _dump(obj: Any, collector: type[list[Any]], pickler_class: type[Any] = pickle.Pickler
          ) -> Buffers:
    parts = collector()
    pickler_class(parts, PROTOCOL).dump(obj)
    return parts


class _KeptPicklers(threading.local):
    """One pickler per collector type and thread, used again and again: making a pickler
    costs more than pickling a small call with it (measured: 1.0 us against 0.4 us).
    A pickler in use (a user ``__reduce__`` that pickles a call) is not used again:
    that dump gets a fresh one."""

    def __init__(self) -> None:
        self.idle: dict[type[list[Any]], tuple[Any, list[Any]]] = {}

    def dump(self, obj: Any, collector: type[list[Any]]) -> Buffers:
        kept = self.idle.pop(collector, None)
        if kept is None:
            parts: Any = collector()
            kept = (pickle.Pickler(parts, PROTOCOL), parts)
        pickler, parts = kept
        try:
            pickler.dump(obj)
            result: Buffers = parts[:]
        finally:
            pickler.clear_memo()  # let go of what was pickled
            parts.clear()
        self.idle[collector] = kept  # not reached on error: that pickler is dropped
        return result


_picklers = _KeptPicklers()


def dumps_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> Buffers:
    """Pickle ``(args, kwargs)``; on failure, name the argument that does not pickle."""
    # BaseException: a user reducer runs here, and even its SystemExit fails only this call;
    # a Ctrl-C is the user's, and goes on.
    try:
        return _picklers.dump((args, kwargs), _Snapshot)
    except KeyboardInterrupt:
        raise
    except BaseException:
        pass
    try:
        return _dump((args, kwargs), _Snapshot, cloudpickle.Pickler)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = _name_unpicklable_argument(fn, args, kwargs, exc)
        raise error from exc


def _name_unpicklable_argument(fn: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any], error: BaseException
                               ) -> ArgumentPicklingError:
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        try:
            cloudpickle.dumps(value, PROTOCOL)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            return argument_pickling_error(
                f"cannot pickle {label} of {callable_name(fn)}() "
                f"(a {type(value).__qualname__}): {type(exc).__name__}: {exc}", exc)
    return argument_pickling_error(
        f"cannot pickle the arguments of {callable_name(fn)}(): {type(error).__name__}: "
        f"{error}", error)


def encode_call(fn_blob: bytes, args: Buffers) -> Buffers:
    head = _FN_LENGTH.pack(len(fn_blob)) + fn_blob
    if len(args) == 1:  # the usual small call: one buffer, one iovec
        return [head + args[0]]
    return [head, *args]


def decode_call(body: Any) -> tuple[bytes | memoryview, Any]:
    """Split a CALL body into the pickled function and the pickled ``(args, kwargs)``:
    views of a body in memory, or for a ``BodyReader`` the function's bytes and the reader
    itself, positioned at the arguments (see ``load_arguments``)."""
    if isinstance(body, BodyReader):
        (fn_length,) = _FN_LENGTH.unpack(body.read(_FN_LENGTH.size))
        return body.read(fn_length), body
    view = memoryview(body)
    (fn_length,) = _FN_LENGTH.unpack_from(view)
    start = _FN_LENGTH.size
    return view[start:start + fn_length], view[start + fn_length:]


def load_arguments(source: Any) -> Any:
    """Unpickle the arguments part of ``decode_call``: from memory, or from the pipe."""
    return pickle.load(source) if isinstance(source, BodyReader) else pickle.loads(source)


# --- outcomes (pickled in the worker, decoded by the dispatcher) ---------------------------

def encode_result(value: Any) -> tuple[Kind, Buffers]:
    """Pickle a return value; if it cannot be, a RAISED frame carries the pickling error
    itself (as the stdlib raises it), with a note naming the value's type."""
    # BaseException throughout: a user __reduce__ runs here, and even its SystemExit must
    # fail only this result, not end the worker.
    try:
        return Kind.RESULT, _picklers.dump(value, _Borrow)
    except BaseException:
        pass
    try:
        return Kind.RESULT, _dump(value, _Borrow, cloudpickle.Pickler)
    except BaseException as exc:
        exc.add_note(f"(raised while pickling the task's return value, a "
                     f"{type(value).__qualname__}, in the worker)")
        return Kind.RAISED, [encode_exception(exc)]


def _reduce_with_traceback(obj: Any) -> Any:
    if isinstance(obj, BaseException):
        return pickling_support.pickle_exception(obj)
    if isinstance(obj, types.TracebackType):
        return pickling_support.pickle_traceback(obj)
    return NotImplemented


class _ExceptionPickler(pickle.Pickler):
    """Pickles exceptions with their tracebacks and chains (tblib's reducers).

    A pickler of its own rather than ``tblib.pickling_support.install()``, which would change
    how every exception pickles in the user's worker process.
    """

    def reducer_override(self, obj: Any) -> Any:
        return _reduce_with_traceback(obj)


class _ExceptionCloudPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """The same, for exception classes that exist only by value (defined in a ``__main__``
    the worker could not import); cloudpickle maps them back to the parent's own class."""

    def reducer_override(self, obj: Any) -> Any:
        reduced = _reduce_with_traceback(obj)
        return super().reducer_override(obj) if reduced is NotImplemented else reduced


def _pickle_with_traceback(exc: BaseException) -> bytes:
    for pickler_class in (_ExceptionPickler, _ExceptionCloudPickler):
        buffer = io.BytesIO()
        try:
            pickler_class(buffer, PROTOCOL).dump(exc)
            return buffer.getvalue()
        except BaseException as err:
            error = err
    raise error


def encode_exception(exc: BaseException) -> bytes:
    """The exception pickled with its frames, plus its type, message and traceback as text.

    The text travels always, so the parent can still explain an exception that it fails to
    unpickle. The worker checks the round trip itself, as most unpickling failures (an
    ``__init__`` that ``args`` cannot satisfy) show up the same on both sides. If the
    exception cannot be pickled, the pickling error goes in its place (``reason`` says so):
    the stdlib raises that error too, and the parent chains the original to it as text.
    """
    text = "".join(traceback.format_exception(exc))
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    message = safe_str(exc)
    blob: bytes | None = None
    reason = ""
    try:
        blob = _round_trip(exc)
    except BaseException as err:  # user reducers run here too
        reason = f"{type(err).__name__}: {safe_str(err)}"
        if err.__context__ is exc:  # raised while exc was being handled; exc will not pickle
            err.__context__ = None
        try:
            blob = _round_trip(err)  # the pickling error itself, raised in the parent
        except BaseException:
            blob = None
    return pickle.dumps((blob, type_name, message, text, reason), PROTOCOL)


def _round_trip(exc: BaseException) -> bytes:
    checked = _pickle_with_traceback(exc)
    pickle.loads(checked)
    return checked


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        return "<str() failed>"


def _envelope(body: bytes | bytearray, size: int) -> tuple[Any, ...]:
    """Unpickle the pool's own tuple around a payload; MalformedFrame if it is not one."""
    try:
        fields = pickle.loads(body)
    except BaseException as err:
        raise MalformedFrame(f"unreadable body: {type(err).__name__}: {err}") from None
    if not isinstance(fields, tuple) or len(fields) != size:
        raise MalformedFrame(f"body is a {type(fields).__name__}, not the pool's envelope")
    return fields


def decode_exception(body: bytes | bytearray) -> BaseException:
    """Rebuild what ``encode_exception`` sent: the exception itself; the error that kept the
    worker from pickling it, with the original as a ``RemoteTaskError`` cause; or, if the
    parent cannot unpickle it, a ``RemoteTaskError``.

    Raises MalformedFrame if the body is not what ``encode_exception`` makes.
    """
    blob, type_name, message, text, reason = _envelope(body, 5)
    if reason:
        reason = f"pickling in the worker failed: {reason}"
    if blob is not None:
        try:
            exc = _loads_detached(blob)
            if isinstance(exc, BaseException):
                if reason:  # the pickling error, standing in for the task's exception
                    exc.__cause__ = RemoteTaskError(type_name, message, text, reason)
                return exc
            reason = f"unpickled to a {type(exc).__name__}, not an exception"
        except BaseException as err:  # user reducers run here; even SystemExit is theirs
            reason = f"unpickling in the parent failed: {type(err).__name__}: {err}"
    return RemoteTaskError(type_name, message, text, reason)


def _loads_detached(data: bytes) -> Any:
    """``pickle.loads`` in a generator's frame, which (on 3.11, 3.13 and 3.14, measured)
    links to no caller once the generator is done: the frames tblib rebuilds then lead
    nowhere near the dispatcher, not even to its running loop (whose frames hold the
    dispatcher itself, which can hold the exception: a cycle only the GC would free). On
    3.12 the chain still reaches the caller; ``release_frames`` empties what it can."""
    def load(data: bytes) -> Iterator[Any]:
        value = pickle.loads(data)
        del data
        yield value

    return next(load(data))


def release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames that an unpickled exception keeps alive.

    tblib rebuilds remote tracebacks out of real frames (and a reducer that fails leaves
    real frames too), whose ``f_back`` chains lead into whoever unpickled them: the
    dispatcher's frames, holding reply bodies and worker handles for as long as the caller
    keeps the exception. Called once those frames have returned; the frames still running
    (the loop's own) are left alone, and so is everything a traceback prints.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        todo += [current.__cause__, current.__context__]
        tb = current.__traceback__
        while tb is not None:
            frame: types.FrameType | None = tb.tb_frame.f_back
            while frame is not None:
                try:
                    frame.clear()
                except RuntimeError:
                    break  # still running: so are all its callers
                frame = frame.f_back
            tb = tb.tb_next


def decode_outcome(frame: Frame) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)`` for a RESULT or RAISED frame.

    A payload that fails to unpickle is that task's error; a body that is not the pool's
    own envelope raises MalformedFrame (the worker is not speaking the protocol).
    """
    if frame.kind is Kind.RESULT:
        try:
            return True, pickle.loads(frame.body)
        except BaseException as err:  # user reducers run here; even SystemExit is theirs
            error = ResultTransferError(None, "unpickling in the parent",
                                        f"{type(err).__name__}: {err}")
            error.__cause__ = err  # (see release_frames)
            return False, error
    if frame.kind is Kind.RAISED:
        return False, decode_exception(frame.body)
    raise MalformedFrame(f"a {frame.kind.name} frame carries no outcome")

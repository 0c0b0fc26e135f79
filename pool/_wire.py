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
import os
import pickle
import struct
import sys
import traceback
import types
from typing import Any, Callable, NamedTuple

import cloudpickle
from tblib import pickling_support

from ._errors import (ArgumentPicklingError, RemoteTaskError, ResultTransferError,
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


class Kind(enum.IntEnum):
    """What a frame carries. ``CALL`` goes to a worker; every other kind comes back."""

    CALL = 1          # body: encode_call(...)
    READY = 2         # the worker is up and its initializer succeeded; empty body
    RESULT = 3        # body: the pickled return value
    RAISED = 4        # body: encode_exception(...)
    UNSENDABLE = 5    # body: pickled (type name, reason): the return value did not pickle
    INIT_FAILED = 6   # body: encode_exception(...) of the initializer's exception
    OVER_MEMORY = 7   # body: resident bytes, as u64; sent just before the reply it follows


class MalformedFrame(Exception):
    """A frame's header was valid but its body is not what its kind promises."""


class Frame(NamedTuple):
    kind: Kind
    task_id: int
    body: bytes | bytearray


# --- blocking frame I/O (worker side, and the dispatcher's writes) -----------------------

def _write_all(fd: int, parts: list[memoryview]) -> None:
    """Write every part, blocking. If BrokenPipeError is raised, ``parts`` holds what was
    not written (the first of them perhaps in part)."""
    while parts:
        written = os.writev(fd, parts[:1024])  # IOV_MAX
        while parts and written >= len(parts[0]):
            written -= len(parts[0])
            parts.pop(0)
        if parts and written:
            parts[0] = parts[0][written:]


def write_frame(fd: int, kind: Kind, task_id: int, body: bytes | bytearray | memoryview = b""
                ) -> None:
    """Write one whole frame, blocking until it is all in the pipe."""
    _write_all(fd, [memoryview(HEADER.pack(MAGIC, kind, task_id, len(body))), memoryview(body)])


def write_frames(fd: int, kind: Kind, frames: list[tuple[int, bytes]]) -> int:
    """Write several frames with as few system calls as the pipe allows; returns how many
    were written whole (fewer only if the reader went away: BrokenPipeError is caught)."""
    parts: list[memoryview] = []
    for task_id, body in frames:
        parts += [memoryview(HEADER.pack(MAGIC, kind, task_id, len(body))), memoryview(body)]
    try:
        _write_all(fd, parts)
    except BrokenPipeError:
        pass
    # Two parts a frame: a frame with any part left (its body, or both) was not written.
    return len(frames) - (len(parts) + 1) // 2


class FrameStream:
    """Blocking frame reader for the worker: one read takes every frame already waiting in
    the pipe (small pipelined calls), and a large body is read straight into its buffer."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def next(self) -> Frame | None:
        """The next frame; None at end of file between frames."""
        while len(self._buffer) < HEADER.size:
            chunk = os.read(self.fd, _READ_CHUNK)
            if not chunk:
                if self._buffer:
                    raise EOFError("pipe closed inside a frame header")
                return None
            self._buffer += chunk
        magic, kind, task_id, length = HEADER.unpack_from(self._buffer)
        if magic != MAGIC or length > MAX_BODY:
            raise ValueError(f"not a pool frame: header {bytes(self._buffer[:HEADER.size])!r}")
        end = HEADER.size + length
        if len(self._buffer) >= end:
            body = self._buffer[HEADER.size:end]
            del self._buffer[:end]
        else:  # the rest of a large body goes straight into its own buffer: no copy
            body = bytearray(length)
            have = len(self._buffer) - HEADER.size
            body[:have] = memoryview(self._buffer)[HEADER.size:]
            self._buffer = bytearray()
            view = memoryview(body)
            while have < length:
                count = os.readv(self.fd, [view[have:]])
                if count == 0:
                    raise EOFError(f"pipe closed after {have} of {length} body bytes")
                have += count
        return Frame(Kind(kind), task_id, body)


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
        self._large: tuple[int, int, bytearray] | None = None  # kind, task_id, body
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
                    body = bytearray(length)
                except MemoryError:
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
        except Exception:
            pass  # a lambda or closure: fall through to pickling by value
    try:
        return bytes(cloudpickle.dumps(_KeepFilename.wrap(fn), PROTOCOL))
    except Exception as exc:
        raise ArgumentPicklingError(
            f"cannot pickle the function {callable_name(fn)}: {type(exc).__name__}: {exc}"
        ) from exc


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


def dumps_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> bytes:
    """Pickle ``(args, kwargs)``; on failure, name the argument that does not pickle."""
    try:
        return pickle.dumps((args, kwargs), PROTOCOL)
    except Exception:
        pass
    try:
        return bytes(cloudpickle.dumps((args, kwargs), PROTOCOL))
    except Exception as exc:
        raise _name_unpicklable_argument(fn, args, kwargs) from exc


def _name_unpicklable_argument(fn: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> ArgumentPicklingError:
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        try:
            cloudpickle.dumps(value, PROTOCOL)
        except Exception as exc:
            return ArgumentPicklingError(
                f"cannot pickle {label} of {callable_name(fn)}() "
                f"(a {type(value).__qualname__}): {type(exc).__name__}: {exc}")
    return ArgumentPicklingError(f"cannot pickle the arguments of {callable_name(fn)}()")


def encode_call(fn_blob: bytes, args_blob: bytes) -> bytes:
    return b"".join((_FN_LENGTH.pack(len(fn_blob)), fn_blob, args_blob))


def decode_call(body: bytes | bytearray) -> tuple[memoryview, memoryview]:
    """Split a CALL body into the pickled function and the pickled ``(args, kwargs)``."""
    view = memoryview(body)
    (fn_length,) = _FN_LENGTH.unpack_from(view)
    start = _FN_LENGTH.size
    return view[start:start + fn_length], view[start + fn_length:]


# --- outcomes (pickled in the worker, decoded by the dispatcher) ---------------------------

def encode_result(value: Any) -> tuple[Kind, bytes]:
    """Pickle a return value; if it cannot be, an UNSENDABLE frame says why."""
    # BaseException throughout: a user __reduce__ runs here, and even its SystemExit must
    # fail only this result, not end the worker.
    try:
        return Kind.RESULT, pickle.dumps(value, PROTOCOL)
    except BaseException:
        pass
    try:
        return Kind.RESULT, bytes(cloudpickle.dumps(value, PROTOCOL))
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}"
        return Kind.UNSENDABLE, pickle.dumps((type(value).__qualname__, reason), PROTOCOL)


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
    ``__init__`` that ``args`` cannot satisfy) show up the same on both sides.
    """
    text = "".join(traceback.format_exception(exc))
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    message = _safe_str(exc)
    try:
        checked = _pickle_with_traceback(exc)
        pickle.loads(checked)
        blob: bytes | None = checked
        reason = ""
    except BaseException as err:  # user reducers run here too
        blob, reason = None, f"{type(err).__name__}: {err}"
    return pickle.dumps((blob, type_name, message, text, reason), PROTOCOL)


def _safe_str(exc: BaseException) -> str:
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
    """Rebuild what ``encode_exception`` sent: the exception itself, or a RemoteTaskError.

    Raises MalformedFrame if the body is not what ``encode_exception`` makes.
    """
    blob, type_name, message, text, reason = _envelope(body, 5)
    if blob is not None:
        try:
            exc = pickle.loads(blob)
            if isinstance(exc, BaseException):
                return exc
            reason = f"unpickled to a {type(exc).__name__}, not an exception"
        except BaseException as err:  # user reducers run here; even SystemExit is theirs
            reason = f"unpickling in the parent failed: {type(err).__name__}: {err}"
    else:
        reason = f"pickling in the worker failed: {reason}"
    return RemoteTaskError(type_name, message, text, reason)


def decode_outcome(frame: Frame) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)`` for a RESULT, RAISED or UNSENDABLE frame.

    A payload that fails to unpickle is that task's error; a body that is not the pool's
    own envelope raises MalformedFrame (the worker is not speaking the protocol).
    """
    if frame.kind is Kind.RESULT:
        try:
            return True, pickle.loads(frame.body)
        except BaseException as err:  # user reducers run here; even SystemExit is theirs
            return False, ResultTransferError(
                None, "unpickling in the parent", f"{type(err).__name__}: {err}")
    if frame.kind is Kind.RAISED:
        return False, decode_exception(frame.body)
    if frame.kind is not Kind.UNSENDABLE:
        raise MalformedFrame(f"a {frame.kind.name} frame carries no outcome")
    type_name, reason = _envelope(frame.body, 2)
    return False, ResultTransferError(type_name, "pickling in the worker", reason)

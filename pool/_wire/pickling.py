"""Pickling: how calls, results and exceptions become frame bodies, and back.

Owns: the (de)serialisation of calls, results and exceptions, and the rules for what
travels by reference (pickle) or by value (cloudpickle).
Runs in: callers' threads (pickling a call), the dispatcher thread (decoding replies) and
the worker (decoding calls, encoding outcomes).
Guarantees: anything that fails to pickle or unpickle becomes a per-task error that names
what failed; a body that is not the pool's own envelope raises ``MalformedFrame``.
Assumes: bodies come whole from ``frames``, or as a ``BodyReader`` for a large call.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import threading
import traceback
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .frames import BodyReader, Buffers, Frame, Kind, MalformedFrame, Unreceivable

if TYPE_CHECKING:
    from .._errors import ArgumentPicklingError

# cloudpickle, tblib and the pool's errors are imported where first needed, not here. A
# worker imports this module at its start, and one whose tasks are pickled by reference
# and return and raise nothing unusual needs none of them. Under spawn and forkserver
# they cost each worker start about 20 ms.

PROTOCOL = 5
_FN_LENGTH = struct.Struct("!I")


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
    import cloudpickle
    try:
        return bytes(cloudpickle.dumps(_KeepFilename.wrap(fn), PROTOCOL))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a reducer's SystemExit too: it fails this call only
        from .._errors import argument_pickling_error, callable_name
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
    instead of copying them into its stream. ``bytes`` are immutable and kept as they are.
    Anything else is copied: a caller that changes a bytearray after submit() must not
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
    costs more than pickling a small call with it (measured: 1.0 us against 0.4 us). A
    dump made while the pickler is in use, by a user ``__reduce__`` that pickles a call,
    gets a fresh one."""

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
    import cloudpickle
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
    import cloudpickle

    from .._errors import argument_pickling_error, callable_name
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
                f"(a {type(value).__qualname__}): {_said(exc)}", exc)
    return argument_pickling_error(
        f"cannot pickle the arguments of {callable_name(fn)}(): {_said(error)}", error)


def _said(exc: BaseException) -> str:
    """``TypeError: cannot pickle ...``; an error without a message by its name alone (a
    ``MemoryError`` usually has none)."""
    text = str(exc)
    name = type(exc).__name__
    if isinstance(exc, MemoryError):
        name += " (out of memory)"
    return f"{name}: {text}" if text else name


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
        import cloudpickle
        return Kind.RESULT, _dump(value, _Borrow, cloudpickle.Pickler)
    except BaseException as exc:
        exc.add_note(f"(raised while pickling the task's return value, a "
                     f"{type(value).__qualname__}, in the worker)")
        return Kind.RAISED, [encode_exception(exc)]


def _reduce_with_traceback(obj: Any) -> Any:
    # Called for every object the exception pickler meets: tblib is imported only for the
    # exceptions and tracebacks among them.
    if isinstance(obj, BaseException):
        from tblib import pickling_support
        try:
            return pickling_support.pickle_exception(obj)
        except Exception:
            # tblib rebuilds an exception that has its own ``__init__`` but the default
            # ``__reduce__`` from its ``__dict__``. A compiled class may have none, such as
            # black's mypyc-built InvalidInput. Such an exception is rebuilt from its own
            # reduction, as pickle would, with the frames and the chain as tblib keeps them.
            reduced = obj.__reduce__()
            if isinstance(reduced, str):   # a global's name: pickle would raise too
                raise
            function, arguments, *rest = reduced
            return (pickling_support.unpickle_exception,
                    (function, arguments, obj.__cause__, obj.__traceback__,
                     obj.__context__, obj.__suppress_context__,
                     getattr(obj, "__notes__", None)), *rest)
    if isinstance(obj, types.TracebackType):
        from tblib import pickling_support
        return pickling_support.pickle_traceback(obj)
    return NotImplemented


class _ExceptionPickler(pickle.Pickler):
    """Pickles exceptions with their tracebacks and chains (tblib's reducers).

    A pickler of its own rather than ``tblib.pickling_support.install()``, which would change
    how every exception pickles in the user's worker process.
    """

    def reducer_override(self, obj: Any) -> Any:
        return _reduce_with_traceback(obj)


def _exception_cloud_pickler() -> type[Any]:
    """The same, for exception classes that exist only by value, defined in a ``__main__``
    the worker could not import. cloudpickle maps them back to the parent's own class. The
    class is made on first use, since its base is cloudpickle's."""
    global _ExceptionCloudPickler
    if _ExceptionCloudPickler is None:
        import cloudpickle

        class ExceptionCloudPickler(cloudpickle.Pickler):  # type: ignore[misc]
            def reducer_override(self, obj: Any) -> Any:
                reduced = _reduce_with_traceback(obj)
                return super().reducer_override(obj) if reduced is NotImplemented else reduced

        _ExceptionCloudPickler = ExceptionCloudPickler
    return _ExceptionCloudPickler


_ExceptionCloudPickler: type[Any] | None = None


def _pickle_with_traceback(exc: BaseException) -> bytes:
    for make_pickler in (lambda: _ExceptionPickler, _exception_cloud_pickler):
        buffer = io.BytesIO()
        try:
            make_pickler()(buffer, PROTOCOL).dump(exc)  # cloudpickle only if pickle fails
            return buffer.getvalue()
        except BaseException as err:
            error = err
    raise error


def encode_exception(exc: BaseException) -> bytes:
    """The exception pickled with its frames, plus its type, message and traceback as text.

    The text always travels, so the parent can still explain an exception it fails to
    unpickle. The worker checks the round trip itself: most unpickling failures, such as an
    ``__init__`` that ``args`` cannot satisfy, show up the same on both sides. If the
    exception cannot be pickled, the pickling error goes in its place, and ``reason`` says
    so. The stdlib raises that error too; the parent chains the original to it as text.
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
    from .._errors import RemoteTaskError
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
    """``pickle.loads`` in a generator's frame. Once the generator is done, that frame
    links to no caller (measured on 3.11, 3.13 and 3.14). The frames tblib rebuilds then
    lead nowhere near the dispatcher, not even to its running loop. The loop's frames hold
    the dispatcher, which can hold the exception: a cycle only the GC would free. On 3.12
    the chain still reaches the caller; ``release_frames`` empties what it can."""
    def load(data: bytes) -> Iterator[Any]:
        value = pickle.loads(data)
        del data
        yield value

    return next(load(data))


def release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames that an unpickled exception keeps alive.

    tblib rebuilds remote tracebacks out of real frames, and a reducer that fails leaves
    real frames too. Their ``f_back`` chains lead into whoever unpickled them: the
    dispatcher's frames, which hold reply bodies and worker handles for as long as the
    caller keeps the exception. Call it once those frames have returned. Frames still
    running, the loop's own, are left alone, and so is everything a traceback prints.
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

    A payload that fails to unpickle is that task's error. A body that is not the pool's
    own envelope raises MalformedFrame: the worker is not speaking the protocol.
    """
    if isinstance(frame.body, Unreceivable):  # the parent had no memory for it
        from .._errors import ResultTransferError
        error = ResultTransferError(None, "receiving in the parent", frame.body.why)
        error.__cause__ = MemoryError(frame.body.why)
        return False, error
    if frame.kind is Kind.RESULT:
        try:
            return True, pickle.loads(frame.body)
        except BaseException as err:  # user reducers run here; even SystemExit is theirs
            from .._errors import ResultTransferError
            error = ResultTransferError(None, "unpickling in the parent",
                                        f"{type(err).__name__}: {err}")
            error.__cause__ = err  # its frames are cleared later: see release_frames
            return False, error
    if frame.kind is Kind.RAISED:
        return False, decode_exception(frame.body)
    raise MalformedFrame(f"a {frame.kind.name} frame carries no outcome")

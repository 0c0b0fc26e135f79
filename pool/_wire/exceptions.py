"""Exceptions on the wire: a task's exception, with its remote frames and its chain, as a
frame body, and back.

Owns: the body of a RAISED or INIT_FAILED frame (``encode_exception``,
``decode_exception``), pickling exceptions with tblib's reducers and tracebacks with the
pool's own (each frame with the source positions of its instruction, so Python's carets
land where they would for a local frame), and freeing the frames an unpickled exception
keeps alive (``release_frames``). The pool's error classes are ``pool._errors``'s.
Runs in: the worker (encoding) and the dispatcher thread (decoding, releasing).
Guarantees: an exception always arrives as an exception: the task's own, the error that
kept the worker from pickling it, or a ``RemoteTaskError`` that says what failed. Its type,
message and traceback travel as text too. A body that is not the pool's own envelope
raises ``MalformedFrame``.
Assumes: a body to decode comes whole from ``frames``. A user's exception and its
reducers may fail in any way, even by ``SystemExit``.
"""

from __future__ import annotations

import functools
import io
import itertools
import pickle
import traceback
import types
from typing import Any, Iterator

from .frames import MalformedFrame
from .picklers import PROTOCOL

# tblib, cloudpickle and the pool's errors are imported where first needed, not here: a
# worker imports this module at its start, and one whose tasks raise nothing needs none of
# them.

# --- encoding, in the worker ---------------------------------------------------------------

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
        return _rebuild_traceback, (_traceback_entries(obj),)
    return NotImplemented


# --- tracebacks ---------------------------------------------------------------------------
#
# A traceback travels as one entry per frame, the way tblib's does (file, function, line),
# plus what tblib's leaves out: the function's qualified name and the source positions of
# the instruction the frame was at (``co_positions()``: line, end line, column, end
# column). Python 3.11+ underlines that span of the real source line in a traceback, with
# ``~~^~~`` under the operator of a binary operation or a subscript. tblib rebuilds each
# frame from a stub ``raise`` statement compiled at the right line, whose columns are the
# stub's own, so the carets pointed at the wrong part of the line. Here each frame's stub
# is compiled from a syntax tree whose one raising instruction (a name that is not
# defined) has exactly the remote positions; the traceback module then reads the real
# line from the source, as it does for a local frame. Where the positions are unknown,
# the stub's have no columns, and no carets show.

# (file name, function name, qualified name, f_globals' __file__ and __name__, line,
# positions): plain values, which pickle anywhere.
_Entry = tuple[str, str, str, Any, Any, int, tuple[Any, ...]]

_STUB_NAME = "__pool_remote_frame__"  # undefined wherever a stub runs: it raises NameError


def _traceback_entries(tb: types.TracebackType | None) -> tuple[_Entry, ...]:
    entries = []
    while tb is not None:
        code = tb.tb_frame.f_code
        f_globals = tb.tb_frame.f_globals
        lineno: int | None = tb.tb_lineno  # None where unknown (3.12+): shown as line 0
        entries.append((code.co_filename, code.co_name, code.co_qualname,
                        f_globals.get("__file__"), f_globals.get("__name__"),
                        -1 if lineno is None else lineno, _positions(code, tb.tb_lasti)))
        tb = tb.tb_next
    return tuple(entries)


def _positions(code: types.CodeType, lasti: int) -> tuple[Any, ...]:
    """(line, end line, column, end column) of the instruction at ``lasti``, any of them
    None where unknown (``-X no_debug_ranges``, or no instruction there)."""
    if lasti < 0:
        return (None, None, None, None)
    return next(itertools.islice(code.co_positions(), lasti // 2, None),
                (None, None, None, None))


def _rebuild_traceback(entries: tuple[_Entry, ...]) -> types.TracebackType | None:
    """The traceback of ``entries``: a real one, of stub frames with the remote names,
    lines and positions, as ``traceback`` and debuggers read them."""
    top: types.TracebackType | None = None
    last: types.TracebackType | None = None
    for filename, name, qualname, file_global, name_global, lineno, positions in entries:
        code = _stub_code(lineno, *positions).replace(co_filename=filename, co_name=name,
                                                      co_qualname=qualname)
        f_globals = {"__file__": file_global, "__name__": name_global}
        try:
            exec(code, f_globals, {})  # noqa: S102 (a stub compiled here; it only raises)
        except NameError as exc:
            assert exc.__traceback__ is not None and exc.__traceback__.tb_next is not None
            entry = exc.__traceback__.tb_next  # the stub's frame, past this one
            del exc
        else:  # pragma: no cover (the stub always raises)
            raise AssertionError(f"the stub of {name} did not raise")
        if last is None:
            top = entry
        else:
            last.tb_next = entry
        last = entry
    try:
        return top
    finally:
        # This frame is the stubs' ``f_back``: what its locals hold, the traceback would
        # hold too, in a cycle only the GC frees.
        del top, last, entry


@functools.lru_cache(maxsize=256)
def _stub_code(lineno: int, start_line: Any, end_line: Any, column: Any,
               end_column: Any) -> types.CodeType:
    """Code whose one raising instruction is at line ``lineno`` with the given positions.

    The positions count only if they are all known and start at ``lineno`` (the line the
    traceback names). Otherwise the instruction has the line alone: a column of -1 in
    the tree compiles to an entry without columns (3.11 to 3.15)."""
    import ast
    unknown = dict(lineno=lineno, end_lineno=lineno, col_offset=-1, end_col_offset=-1)
    if start_line == lineno and None not in (end_line, column, end_column):
        where = dict(lineno=lineno, end_lineno=end_line, col_offset=column,
                     end_col_offset=end_column)
    else:
        where = unknown
    try:
        return compile(_stub_tree(ast, where), "<pool remote frame>", "exec",
                       dont_inherit=True)
    except ValueError:  # positions that are no range (a worker's bytes): no carets
        return compile(_stub_tree(ast, unknown), "<pool remote frame>", "exec",
                       dont_inherit=True)


def _stub_tree(ast: Any, where: dict[str, Any]) -> Any:
    name = ast.Name(id=_STUB_NAME, ctx=ast.Load(), **where)
    return ast.Module(body=[ast.Expr(value=name, **where)], type_ignores=[])


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


# --- decoding, in the dispatcher -----------------------------------------------------------

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

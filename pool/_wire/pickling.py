"""Pickling: how calls and results become frame bodies, and back.

Owns: the bodies of CALL and RESULT frames, and the rules for what travels by reference
(pickle) or by value (cloudpickle). A raised exception's body is ``exceptions``'s; the
picklers that write bodies are ``picklers``'s.
Runs in: callers' threads (pickling a call), the dispatcher thread (decoding replies) and
the worker (decoding calls, encoding outcomes).
Guarantees: anything that fails to pickle or unpickle becomes a per-task error that names
what failed; a body that is not the pool's own envelope raises ``MalformedFrame``.
Assumes: bodies come whole from ``frames``, or as a ``BodyReader`` for a large call.
"""

from __future__ import annotations

import pickle
import struct
import sys
from typing import TYPE_CHECKING, Any, Callable

from . import loans, payloads, segments, shared_calls
from .exceptions import decode_exception, encode_exception
from .frames import BodyReader, Buffers, Frame, Kind, MalformedFrame, Unreceivable
from .picklers import (PROTOCOL, Borrow, SharingBorrow, SharingSnapshot, Snapshot,
                       by_value_pickler, dump, dumps_by_value, kept_picklers)

if TYPE_CHECKING:
    from .._errors import ArgumentPicklingError

# cloudpickle and the pool's errors are imported where first needed, not here. A worker
# imports this module at its start, and one whose tasks are pickled by reference and
# return and raise nothing unusual needs none of them. Under spawn and forkserver they
# cost each worker start about 20 ms.
_FN_LENGTH = struct.Struct("!I")
# Set in a CALL body's function length when a segment envelope follows the function: the
# call's large payloads are in shared memory (``segments``).
_IN_SEGMENT = 1 << 31


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
        return dumps_by_value(fn)  # (keeping its file's name: picklers.by_value_pickler)
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
    return (getattr(main, "__file__", None) is not None
            or getattr(main, "__spec__", None) is not None)


# A task function with this attribute set true has its arguments pickled by value
# (cloudpickle's pickler) from the start, not only where the stdlib's fails: what they hold
# of ``__main__`` then reaches workers that cannot import it. (``_worker.batches.run_batch``:
# joblib's calls, which loky sends so.)
ARGUMENTS_BY_VALUE = "pool_arguments_by_value"


def dumps_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> Buffers:
    """Pickle ``(args, kwargs)``; on failure, name the argument that does not pickle.
    Large payloads go into a shared-memory segment where the platform has them."""
    # BaseException: a user reducer runs here, and even its SystemExit fails only this call;
    # a Ctrl-C is the user's, and goes on.
    sharing = segments.enabled()
    if not getattr(fn, ARGUMENTS_BY_VALUE, False):
        try:
            return kept_picklers.dump((args, kwargs), SharingSnapshot if sharing else Snapshot)
        except KeyboardInterrupt:
            raise
        except segments.LargePayload:
            try:
                return _dump_shared((args, kwargs), pickle.Pickler)
            except KeyboardInterrupt:
                raise
            except BaseException:
                pass
        except BaseException:
            pass
    try:
        if sharing:
            try:
                return dump((args, kwargs), SharingSnapshot, by_value_pickler())
            except segments.LargePayload:
                return _dump_shared((args, kwargs), by_value_pickler())
        return dump((args, kwargs), Snapshot, by_value_pickler())
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = _name_unpicklable_argument(fn, args, kwargs, exc)
        raise error from exc


def _dump_shared(obj: Any, pickler_class: type[Any]) -> Buffers:
    """``obj`` with its large payloads in a segment, or wholly in the pipe's body if this
    process may have no more segments."""
    body = shared_calls.dump_call(obj, pickler_class, Snapshot)
    return body if body is not None else dump(obj, Snapshot, pickler_class)


def _name_unpicklable_argument(fn: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any], error: BaseException
                               ) -> ArgumentPicklingError:
    from .._errors import argument_pickling_error, callable_name
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        try:
            dumps_by_value(value)
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
    if type(args[0]) is shared_calls.SharedRef:  # kept as a part: it holds the segment
        return [_FN_LENGTH.pack(len(fn_blob) | _IN_SEGMENT) + fn_blob, *args]
    head = _FN_LENGTH.pack(len(fn_blob)) + fn_blob
    if len(args) == 1:  # the usual small call: one buffer, one iovec
        return [head + args[0]]
    return [head, *args]


def decode_call(body: Any) -> tuple[bytes | memoryview, Any, Any]:
    """Split a CALL body into the pickled function, the pickled ``(args, kwargs)`` and the
    segment envelope of its payloads (None if it has none). The arguments are a view of
    a body in memory, or for a ``BodyReader`` the reader itself, positioned at them (see
    ``load_arguments``)."""
    if isinstance(body, BodyReader):
        (fn_length,) = _FN_LENGTH.unpack(body.read(_FN_LENGTH.size))
        fn_blob = body.read(fn_length & ~_IN_SEGMENT)
        envelope = None
        if fn_length & _IN_SEGMENT:
            envelope = body.read(payloads.ENVELOPE_HEAD)
            envelope += body.read(payloads.envelope_length(envelope) - len(envelope))
        return fn_blob, body, envelope
    view = memoryview(body)
    (fn_length,) = _FN_LENGTH.unpack_from(view)
    start = _FN_LENGTH.size
    end = start + (fn_length & ~_IN_SEGMENT)
    if not fn_length & _IN_SEGMENT:
        return view[start:end], view[end:], None
    envelope_end = end + payloads.envelope_length(view[end:])
    return view[start:end], view[envelope_end:], view[end:envelope_end]


def load_arguments(source: Any, call: shared_calls.CallView | None = None) -> Any:
    """Unpickle the arguments part of ``decode_call``: from memory, or from the pipe; with
    ``call``, the view of the call's segment, its payloads from there."""
    if call is not None:
        return call.load(source)
    return pickle.load(source) if isinstance(source, BodyReader) else pickle.loads(source)


# --- results (pickled in the worker, decoded by the dispatcher) ----------------------------

# Set on the pickling error of a task's return value, naming the value's type; it travels
# in the exception's ``__dict__``. pool.Pool reports such an error as the stdlib's pool
# does, as a ``MaybeEncodingError`` (``_mp_results``).
UNPICKLABLE_RESULT = "_pool_unpicklable_result"


def encode_result(value: Any, *, copied: bool = False) -> tuple[Kind, Buffers]:
    """Pickle a return value; if it cannot be, a RAISED frame carries the pickling error
    itself (as the stdlib raises it), with a note naming the value's type. ``copied``:
    the body must not borrow from the value (it may be a view of the call's segment,
    which is closed before the reply is written). Large payloads go into the segment the
    parent lent this worker, if it has one."""
    collector: type[list[Any]] = Snapshot if copied else Borrow
    desk = loans.worker_desk
    # BaseException throughout: a user __reduce__ runs here, and even its SystemExit must
    # fail only this result, not end the worker.
    try:
        return Kind.RESULT, kept_picklers.dump(
            value, collector if desk is None else SharingSnapshot if copied else SharingBorrow)
    except segments.LargePayload:
        assert desk is not None
        try:
            if (body := desk.dump_result(value, collector)) is not None:
                return Kind.RESULT, body
        except BaseException:
            pass
        try:
            return Kind.RESULT, kept_picklers.dump(value, collector)
        except BaseException:
            pass
    except BaseException:
        pass
    try:
        return Kind.RESULT, dump(value, collector, by_value_pickler())
    except BaseException as exc:
        exc.add_note(f"(raised while pickling the task's return value, a "
                     f"{type(value).__qualname__}, in the worker)")
        try:
            setattr(exc, UNPICKLABLE_RESULT, type(value).__qualname__)
        except BaseException:
            pass  # an exception without a __dict__: the note still says it
        return Kind.RAISED, [encode_exception(exc)]


def decode_outcome(frame: Frame, desk: loans.LoanDesk | None = None
                   ) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)`` for a RESULT or RAISED frame; ``desk``
    is the worker's, for a result whose payloads are in the segment it was lent.

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
            if frame.body[:1] != payloads.MARKER:
                return True, pickle.loads(frame.body)
            if desk is None:
                raise MalformedFrame("a result in a segment, from a worker lent none")
            return True, desk.load_result(frame.body)
        except MalformedFrame:
            raise
        except segments.NoRoom as room:
            from .._errors import ResultTransferError
            error = ResultTransferError(None, "receiving in the parent", str(room))
            error.__cause__ = MemoryError(str(room))
            return False, error
        except BaseException as err:  # user reducers run here; even SystemExit is theirs
            from .._errors import ResultTransferError
            error = ResultTransferError(None, "unpickling in the parent",
                                        f"{type(err).__name__}: {err}")
            error.__cause__ = err  # its frames are cleared later: see exceptions.release_frames
            return False, error
    if frame.kind is Kind.RAISED:
        return False, decode_exception(frame.body)
    raise MalformedFrame(f"a {frame.kind.name} frame carries no outcome")

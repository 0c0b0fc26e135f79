"""The picklers that write frame bodies: the protocol, the collectors that keep large payloads
out of the pickle stream, and the picklers kept for use again.

Owns: ``PROTOCOL``; how a pickler's output is collected (``Snapshot``, ``Borrow``); the
picklers kept per thread and collector (``kept_picklers``); the by-value pickler
(``by_value_pickler``: cloudpickle's, refusing what the stdlib refuses).
Runs in: callers' threads (pickling a call) and the worker (pickling a result). A kept
pickler belongs to one thread.
Guarantees: what a ``Snapshot`` holds no longer changes with the caller's objects; what a
``Borrow`` holds is flat bytes or a byte view, ready for ``writev``. A pickler that failed
is not kept: the next dump gets a fresh one.
Assumes: a ``Borrow``'s buffers are written before the value they borrow from changes.
"""

from __future__ import annotations

import pickle
import sys
import threading
import types
from typing import Any

from .frames import Buffers
from .segments import SHARED_ABOVE, LargePayload

PROTOCOL = 5

_ByValuePickler: type[Any] | None = None


def _with_filename(make: Any, args: tuple[Any, ...], filename: str) -> Any:
    """A code object cloudpickle sent, with its file's name back (``by_value_pickler``)."""
    code = make(*args)
    try:
        return code.replace(co_filename=filename)
    except (AttributeError, TypeError, ValueError):  # cosmetic only
        return code


def by_value_pickler() -> type[Any]:
    """cloudpickle's pickler, except that an open text file is refused as the stdlib's
    pickle refuses it (``TypeError: cannot pickle '_io.TextIOWrapper' object``).
    cloudpickle would send a ``StringIO`` copy of what is left to read: a different object,
    silently, where ``ProcessPoolExecutor`` fails the call. Made on first use, since its
    base is cloudpickle's (a worker whose tasks go by reference never imports it)."""
    global _ByValuePickler
    if _ByValuePickler is None:
        import io
        from collections import ChainMap

        import cloudpickle

        def refuse(obj: Any) -> Any:
            # The standard streams, as a closure or a print(file=) keyword holds them, go
            # as cloudpickle sends them: as the worker's own stream of that name.
            for name in ("stdout", "stderr"):
                if obj is getattr(sys, name) or obj is getattr(sys, f"__{name}__"):
                    return getattr, (sys, name)
            cls = type(obj)
            raise TypeError(f"cannot pickle '{cls.__module__}.{cls.__qualname__}' object")

        ours: dict[type, Any] = {io.TextIOWrapper: refuse}
        reduce_code = cloudpickle.Pickler.dispatch_table.get(types.CodeType)
        if reduce_code is not None:
            def keep_filename(code: types.CodeType) -> Any:
                # cloudpickle (3.1+) names every code object it sends "<dynamic-code>"; a
                # crash report's or a traceback's frames should name the user's file.
                # (Nested code objects, a class's methods, come through here too.) A
                # reduction of another shape is left as it is: the name is cosmetic.
                reduced = reduce_code(code)
                if (isinstance(reduced, tuple) and len(reduced) == 2
                        and callable(reduced[0]) and isinstance(reduced[1], tuple)):
                    return _with_filename, (reduced[0], reduced[1], code.co_filename)
                return reduced

            ours[types.CodeType] = keep_filename

        class ByValuePickler(cloudpickle.Pickler):  # type: ignore[misc]
            # (cloudpickle's table already chains copyreg's.)
            dispatch_table = ChainMap(ours, cloudpickle.Pickler.dispatch_table)

        _ByValuePickler = ByValuePickler
    return _ByValuePickler


def dumps_by_value(obj: Any) -> bytes:
    """``obj`` pickled by value, as ``cloudpickle.dumps`` would, with ``by_value_pickler``."""
    import io
    buffer = io.BytesIO()
    by_value_pickler()(buffer, PROTOCOL).dump(obj)
    return buffer.getvalue()


class Snapshot(list):  # type: ignore[type-arg]
    """Collects what a pickler writes. The pickler hands large payloads over by reference
    instead of copying them into its stream. ``bytes`` are immutable and kept as they are.
    Anything else is copied: a caller that changes a bytearray after submit() must not
    change what the task receives."""

    def write(self, data: Any) -> None:
        # tobytes("A"): the memory as it is laid out (a Fortran-order array stays one).
        self.append(data if type(data) is bytes else memoryview(data).tobytes("A"))


class Borrow(list):  # type: ignore[type-arg]
    """Collects what a pickler writes, payloads by reference: for a value written at once."""

    def write(self, data: Any) -> None:
        if type(data) is not bytes:  # a bytearray or a buffer: as flat bytes, for writev
            view = memoryview(data)
            data = view.cast("B") if view.c_contiguous else view.tobytes("A")
        self.append(data)


def _stop_if_large(data: Any) -> None:
    """Raise ``LargePayload`` for a write large enough for shared memory (the pickler
    writes such a payload on its own, as the object itself or a buffer of it)."""
    if (len(data) if type(data) is bytes else memoryview(data).nbytes) >= SHARED_ABOVE:
        raise LargePayload


class SharingSnapshot(Snapshot):
    """A ``Snapshot`` that stops the pickler at the first payload large enough for shared
    memory (``segments.LargePayload``): the object is then pickled for a segment."""

    def write(self, data: Any) -> None:
        _stop_if_large(data)
        Snapshot.write(self, data)


class SharingBorrow(Borrow):
    """A ``Borrow`` that stops the pickler at the first payload large enough for shared
    memory, as ``SharingSnapshot``."""

    def write(self, data: Any) -> None:
        _stop_if_large(data)
        Borrow.write(self, data)


def dump(obj: Any, collector: type[list[Any]], pickler_class: type[Any] = pickle.Pickler
         ) -> Buffers:
    """``obj`` pickled by a new pickler of ``pickler_class`` into a new ``collector``."""
    parts = collector()
    pickler_class(parts, PROTOCOL).dump(obj)
    return parts


class KeptPicklers(threading.local):
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


kept_picklers = KeptPicklers()

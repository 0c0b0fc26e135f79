"""A call's large payloads in a segment: the parent copies them in at submit, the worker
views them.

Owns: ``SharedRef`` (a call's envelope, as a part of its body, holding its segment) and
the worker's ``CallView`` of the call it runs (``current_call``).
Runs in: callers' threads (``dump_call``), the dispatcher thread (``retire``), any thread
that lets go of a call's body (``SharedRef.__del__``), and the worker (``CallView``).
Guarantees:
- a payload is copied into its segment when the call is submitted, so a caller's later
  change to a bytearray or an array does not change the task; an array then arrives in the
  worker as a view of the segment, without a copy;
- a call's segment is reused once its task ended, the worker having closed its view or
  died; never if the task kept a view of its arguments, or forked while it viewed them
  (the worker marks it kept, in the segment's header, before it replies or as it forks),
  nor if its worker may still live or left processes behind (``retire``).
Assumes: a worker runs one call at a time.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from .frames import Buffers
from . import segments as _segments
from .payloads import (buffers_extent, envelope, extent, layout, load, pickler_for,
                       read_envelope, views_of)
from .segments import MAP_FLAGS, Segment, openable

# A call's segment starts with this header: its first byte is 1 once a worker kept it.
_CALL_HEADER = 64

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
                _segments.cache.give_back(segment)
            except Exception:  # at interpreter exit, with the module half gone
                pass


def dump_call(obj: Any, base: type[Any], collector: type[list[Any]]) -> Buffers | None:
    """``obj`` pickled with its large payloads copied into a segment: ``[envelope, stream
    parts...]``; or None if no segment can be had (the caller uses the pipe)."""
    payloads: list[tuple[memoryview, int]] = []
    stream = collector()
    pickler_for(base)(stream, payloads).dump(obj)
    if not payloads:  # large, but not a buffer (a long str): the stream carries it
        return list(stream)
    offsets, end = layout(payloads, _CALL_HEADER)
    segment = _segments.cache.take(end) if openable() else None
    if segment is None:
        return None
    try:
        target = segment.writable()
        target[0] = 0  # not kept (it may have been, by a worker that has since died)
        for (view, _), offset in zip(payloads, offsets):
            target[offset:offset + view.nbytes] = view
        ref = SharedRef(envelope(os.getpid(), segment.fd, segment.ino, 0, payloads,
                                  offsets))
    except OSError:  # no address space to map it (a memory limit): the pipe, then
        _segments.cache.give_back(segment)
        return None
    except BaseException:
        _segments.cache.give_back(segment)
        raise
    ref.segment = segment
    return [ref, *stream]


def retire(body: Buffers) -> None:
    """Never reuse the segment of this call's body: a process other than its worker may
    still view it (the worker was not reaped, or left processes in its group)."""
    for part in body:
        if type(part) is SharedRef:
            part.segment.retired = True


class CallView:
    """The worker's view of a call's segment, from the envelope the call came with."""

    def __init__(self, envelope: Any) -> None:
        global current_call
        (pid, fd, ino, _), self._payloads, _ = read_envelope(envelope)
        self._fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            status = os.fstat(self._fd)
            if status.st_ino != ino:
                raise OSError(f"descriptor {fd} of pid {pid} is no longer the call's segment")
            if extent(self._payloads) > status.st_size:
                raise OSError(f"the call's segment holds {status.st_size} bytes, fewer "
                              f"than its payloads")
            mapped = buffers_extent(self._payloads)
            self._map = (mmap.mmap(self._fd, mapped, flags=MAP_FLAGS) if mapped
                         else None)
        except BaseException:
            os.close(self._fd)
            raise
        self._views = views_of(self._map, self._payloads)
        current_call = self

    def load(self, stream: Any) -> Any:
        return load(stream, self._fd, self._payloads, self._views)

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




def _before_fork() -> None:
    if current_call is not None:  # a task forks while it views its arguments: the child
        current_call.mark_kept()   # may read them after the task ends, or outlive it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)

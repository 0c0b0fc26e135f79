"""A worker's record of the items of a chunk it has finished, kept where its death cannot
take it: a file shared with the parent, which reads it only if the worker dies.

Owns: the format of the progress file, its worker-side writer (``Recorder``) and its
parent-side reader (``read``, ``ItemProgress``).
Runs in: the worker (``recorder`` and the ``Recorder``, as ``_worker.items.run_items``
calls them), and the dispatcher thread (``read``, when it
releases a dead worker). Decoding the
recorded values (``ItemProgress.outcomes``) runs user code and belongs to a caller's or a
callback thread.
Guarantees:
- what a dead worker's file says is true: ``finished`` items finished, in order, each with
  its value or its encoded exception, for the task whose id is ``task_id``. A kill between
  any two instructions leaves at worst the last item unrecorded: its record is written
  before the count that includes it;
- an item whose value cannot be recorded (it does not pickle, or the file is full) stops
  the recording for the rest of the chunk and says so (``stopped``): items after it ran,
  and their outcomes are unknown to the parent. The reply the chunk sends when it ends is
  not affected;
- memory: the file is sparse and holds one chunk at a time; a chunk that wrote more than
  ``_KEEP_BYTES`` gives its pages back before the next begins.
Assumes: one thread of the worker records (the task's), and the parent reads only after
the worker is dead.

Layout: a header of four uint64 in this machine's order (the task id; whether the record
stopped; the number of records; where they end), then the records from ``HEADER_BYTES``:
one pickle each, by one pickler (they share its memo), of the value or of an
``ItemFailed`` for an item that raised. After each record its end is written, then the
count that includes it.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
from typing import Any, Callable, Iterator, NamedTuple

from . import main as _main

HEADER = struct.Struct("=QQQQ")  # native order, standard sizes: what memoryview "Q" writes
HEADER_BYTES = HEADER.size
# The words: the task's id; 1 if the record stopped; how many records; where they end.
_TASK_ID, _STOPPED, _COUNT, _END = range(4)
# The most a chunk records. The file is sparse: only what is written takes memory.
CAPACITY = 16 * 1024 * 1024
# A chunk that wrote more gives its pages back before the next chunk begins.
_KEEP_BYTES = 1024 * 1024


class ItemFailed:
    """A recorded item that raised: its exception, encoded as a task's (``_wire.exceptions``)."""

    __slots__ = ("encoded",)

    def __init__(self, encoded: bytes) -> None:
        self.encoded = encoded

    def __reduce__(self) -> tuple[Any, ...]:
        return ItemFailed, (self.encoded,)


# -- the worker's side -------------------------------------------------------------------

class Recorder:
    """Runs one chunk's calls and records each item's outcome as it comes: a value, or an
    ``ItemFailed`` for an item that raised."""

    def __init__(self, mapped: mmap.mmap, fd: int) -> None:
        self._map = mapped
        self._fd = fd
        # The header's words, written in place (native order: the reader is this machine).
        self._header = memoryview(mapped)[:HEADER_BYTES].cast("Q")
        self._dump: Callable[[Any], None] | None = None  # None: recording stopped
        self._done = 0

    def begin(self, task_id: int) -> None:
        """Starts the chunk of task ``task_id``."""
        mapped = self._map
        if mapped.tell() > _KEEP_BYTES:  # the last chunk wrote much: its pages go back
            try:
                os.ftruncate(self._fd, 0)
                os.ftruncate(self._fd, CAPACITY)
            except OSError:
                pass
        header = self._header
        # Zeros first, the task id last: a kill in between leaves another task's id,
        # which the parent does not take for this one.
        header[_STOPPED], header[_COUNT], header[_END] = 0, 0, HEADER_BYTES
        header[_TASK_ID] = task_id
        mapped.seek(HEADER_BYTES)
        # One pickler for the chunk, writing into the map. Its memo is kept from record to
        # record (the parent reads them with one unpickler): no clearing per item.
        self._dump = pickle.Pickler(mapped, pickle.HIGHEST_PROTOCOL).dump
        self._done = 0

    def run(self, calls: Iterator[Any], values: list[Any]) -> None:
        """Appends each value ``calls`` gives to ``values``, recording it before the next
        call. Raises what a call raises: the caller records that item (``failure``) and
        calls again to go on. The loop is written out here, not a function per item: this
        is the cost of the record, paid on every item of every chunk."""
        dump = self._dump
        if dump is None:  # stopped: the rest at C speed
            values.extend(calls)
            return
        append, tell, header = values.append, self._map.tell, self._header
        done = self._done
        try:
            for value in calls:
                append(value)
                try:
                    dump(value)
                except BaseException:  # it does not pickle (or its reduce raised), or no room
                    self._stop()
                    values.extend(calls)
                    return
                done += 1
                header[_END] = tell()  # the record is in; then where it ends; then the count
                header[_COUNT] = done
        finally:
            self._done = done

    def failure(self, encoded: bytes) -> None:
        """The item after those recorded raised; ``encoded`` is its exception."""
        dump = self._dump
        if dump is None:
            return
        try:
            dump(ItemFailed(encoded))
        except BaseException:
            self._stop()
            return
        self._done += 1
        self._header[_END] = self._map.tell()
        self._header[_COUNT] = self._done

    def _stop(self) -> None:
        """Records nothing more of this chunk, and says so."""
        self._dump = None
        self._header[_STOPPED] = 1


_recorder: Recorder | None = None


def recorder() -> Recorder | None:
    """The worker's recorder, mapped at its first chunk; None outside a worker, or where
    the file could not be made or mapped (the worker's death then fails the whole chunk)."""
    global _recorder
    if _recorder is None and _main._progress_fd is not None:
        fd, _main._progress_fd = _main._progress_fd, None  # one try
        try:
            os.ftruncate(fd, CAPACITY)
            mapped = mmap.mmap(fd, CAPACITY)
        except (OSError, ValueError):
            return None
        _recorder = Recorder(mapped, fd)
    return _recorder


# -- the parent's side -------------------------------------------------------------------

# The attribute of a task's WorkerDied or TaskTimeout that holds what its chunk recorded
# (an ItemProgress), set by the dispatcher when the task was the one recorded.
ITEM_PROGRESS = "_pool_item_progress"


class ItemProgress(NamedTuple):
    """What a dead worker recorded of the chunk it was running."""
    task_id: int
    finished: int       # items finished, from the chunk's first
    stopped: bool       # the record stopped: items after the finished ones may have run
    records: bytes

    def outcomes(self) -> list[tuple[bool, Any]]:
        """Each recorded item's ``(True, value)`` or ``(False, encoded exception)``, in
        order. Runs user code (unpickling values): never on the dispatcher thread. Raises
        what unpickling raises."""
        unpickler = pickle.Unpickler(io.BytesIO(self.records))  # one: the records share a memo
        found: list[tuple[bool, Any]] = []
        for _ in range(self.finished):
            item = unpickler.load()
            if type(item) is ItemFailed:
                found.append((False, item.encoded))
            else:
                found.append((True, item))
        return found


def read(fd: int | None) -> ItemProgress | None:
    """What the worker recorded in its progress file, or None if it recorded nothing."""
    if fd is None:
        return None
    try:
        header = os.pread(fd, HEADER_BYTES, 0)
        if len(header) < HEADER_BYTES:
            return None
        task_id, stopped, count, end = HEADER.unpack(header)
        if task_id == 0 or not HEADER_BYTES <= end <= CAPACITY:
            return None
        records = os.pread(fd, end - HEADER_BYTES, HEADER_BYTES) if count else b""
    except OSError:
        return None
    return ItemProgress(task_id, count, bool(stopped), records)

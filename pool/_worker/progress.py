"""A worker's record of the items of a chunk it has finished, kept where its death cannot
take it: a file shared with the parent, which reads it when the worker has ended.

Owns: the format of the progress file, its worker-side writers (``MappedRecorder`` for a
memfd, ``FileRecorder`` for a file on disk) and its parent-side reader (``read``,
``ItemProgress``).
Runs in: the worker (``recorder`` and the recorders, as ``_worker.items.run_items`` calls
them), and the dispatcher thread (``read``, when it releases a worker). Decoding the
recorded values (``ItemProgress.outcomes``) runs user code and belongs to a caller's or a
callback thread.
Guarantees:
- what a dead worker's file says is true: ``finished`` items finished, in order, each with
  its value or its encoded exception (a chunk run by ``count``: the number alone), for the
  task whose id is ``task_id``. A kill between
  any two instructions leaves at worst the last item unrecorded: its record is written
  before the count that includes it;
- an item whose value cannot be recorded (it does not pickle, or the file is full) stops
  the recording for the rest of the chunk and says so (``stopped``): items after it ran,
  and their outcomes are unknown to the parent. The reply the chunk sends when it ends is
  not affected;
- a process forked from a worker (a pool inside a task) never writes its parent's file;
- memory: the file is sparse and holds one chunk at a time; a chunk that wrote more than
  ``_KEEP_BYTES`` gives its pages back before the next begins. A file on disk is written
  with ``pwrite``, never through a map: a full disk stops the record, where a map would
  kill the worker with SIGBUS.
Assumes: one thread of the worker records (the task's), and the parent reads only after
the worker is dead.

Layout: a header of four uint64 in this machine's order (the task id; whether the record
stopped; the number of records; where they end), then the records from ``HEADER_BYTES``:
one pickle each, of the value or of an ``ItemFailed`` for an item that raised. After each
record its end is written, then the count that includes it.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import sys
from typing import Any, Iterator, NamedTuple

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

_COUNT_AND_END = struct.Struct("=QQ")  # the header's last two words, written together


class Recorder:
    """Runs one chunk's calls and records each item's outcome as it comes: a value, or an
    ``ItemFailed`` for an item that raised. Two kinds, one interface: ``MappedRecorder``
    (a memfd, written through a map) and ``FileRecorder`` (a file on disk, written with
    ``pwrite``, which reports a full disk where a map would kill the worker with SIGBUS)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pid = os.getpid()  # a process forked from this one must not write here
        self._done = 0
        self._stopped = True    # until a chunk begins

    def begin(self, task_id: int) -> bool:
        """Starts the chunk of task ``task_id``; False if nothing can be recorded now."""
        raise NotImplementedError

    def run(self, calls: Iterator[Any], values: list[Any]) -> None:
        """Appends each value ``calls`` gives to ``values``, recording it before the next
        call. Raises what a call raises: the caller records that item (``failure``) and
        calls again to go on. The loop is written out, not a function per item: this is
        the cost of the record, paid on every item of every chunk."""
        raise NotImplementedError

    def count(self, calls: Iterator[Any], values: list[Any]) -> None:
        """As ``run``, but records how many items ended and not their values: for a face
        that needs to know which item was running when the worker died, and not what the
        others returned (``pool.joblib``, whose first error ends the whole call). Costs a
        store per item, where ``run`` pickles each value. A chunk counted so has no
        records: its ``ItemProgress.outcomes`` is not to be read."""
        raise NotImplementedError

    def failure(self, encoded: bytes) -> None:
        """The item after those recorded raised; ``encoded`` is its exception."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Records nothing more of this chunk, and says so in the file."""
        raise NotImplementedError

    def _rest_unrecorded(self, calls: Iterator[Any], values: list[Any]) -> None:
        """An item could not be recorded: the record stops, and the rest runs at C speed
        (raising what a call raises, as ``run`` does)."""
        self._stop()
        values.extend(calls)


class MappedRecorder(Recorder):
    def __init__(self, fd: int, mapped: mmap.mmap) -> None:
        super().__init__(fd)
        self._map = mapped
        # The header's words, written in place (native order: the reader is this machine).
        self._header = memoryview(mapped)[:HEADER_BYTES].cast("Q")
        self._pickler = pickle.Pickler(mapped, pickle.HIGHEST_PROTOCOL)

    def begin(self, task_id: int) -> bool:
        mapped = self._map
        if mapped.tell() > _KEEP_BYTES:  # the last chunk wrote much: its pages go back
            try:
                os.ftruncate(self.fd, 0)
                os.ftruncate(self.fd, CAPACITY)
            except OSError:  # the map may now end short of its pages: never touch it again
                self._stopped = True
                return False
        header = self._header
        # Zeros first, the task id last: a kill in between leaves another task's id,
        # which the parent does not take for this one.
        header[_STOPPED], header[_COUNT], header[_END] = 0, 0, HEADER_BYTES
        header[_TASK_ID] = task_id
        mapped.seek(HEADER_BYTES)
        # One pickler, writing into the map; its memo is cleared after each record, so
        # each is a pickle of its own: a value changed and returned again is recorded
        # as it is then.
        self._pickler = pickle.Pickler(mapped, pickle.HIGHEST_PROTOCOL)
        self._done = 0
        self._stopped = False
        return True

    def run(self, calls: Iterator[Any], values: list[Any]) -> None:
        if self._stopped:  # the rest at C speed
            values.extend(calls)
            return
        append, tell, header = values.append, self._map.tell, self._header
        dump, clear_memo = self._pickler.dump, self._pickler.clear_memo
        done = self._done
        unrecordable = False
        try:
            for value in calls:
                append(value)
                try:
                    dump(value)
                except BaseException:  # it does not pickle (or its reduce raised), or no room
                    unrecordable = True
                    break
                clear_memo()
                done += 1
                header[_END] = tell()  # the record is in; then where it ends; then the count
                header[_COUNT] = done
        finally:
            self._done = done
        if unrecordable:  # (out of the except: a later item's error must not chain to it)
            self._rest_unrecorded(calls, values)

    def count(self, calls: Iterator[Any], values: list[Any]) -> None:
        if self._stopped:
            values.extend(calls)
            return
        append, header, done = values.append, self._header, self._done
        try:
            for value in calls:
                append(value)
                done += 1
                header[_COUNT] = done
        finally:
            self._done = done

    def failure(self, encoded: bytes) -> None:
        if self._stopped:
            return
        try:
            self._pickler.dump(ItemFailed(encoded))
        except BaseException:
            self._stop()
            return
        self._pickler.clear_memo()
        self._done += 1
        self._header[_END] = self._map.tell()
        self._header[_COUNT] = self._done

    def _stop(self) -> None:
        self._stopped = True
        self._header[_STOPPED] = 1


class FileRecorder(Recorder):
    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        self._end = HEADER_BYTES

    def begin(self, task_id: int) -> bool:
        try:
            if self._end > _KEEP_BYTES:  # the last chunk wrote much: give the space back
                os.ftruncate(self.fd, 0)
            # As the map's: zeros, then the task id.
            os.pwrite(self.fd, HEADER.pack(0, 0, 0, HEADER_BYTES), 0)
            os.pwrite(self.fd, HEADER.pack(task_id, 0, 0, HEADER_BYTES)[:8], 0)
        except OSError:
            self._stopped = True
            return False
        self._end = HEADER_BYTES
        self._done = 0
        self._stopped = False
        return True

    def run(self, calls: Iterator[Any], values: list[Any]) -> None:
        if self._stopped:
            values.extend(calls)
            return
        append, pwrite, dumps, fd = values.append, os.pwrite, pickle.dumps, self.fd
        pack, protocol = _COUNT_AND_END.pack, pickle.HIGHEST_PROTOCOL
        done, end = self._done, self._end
        unrecordable = False
        try:
            for value in calls:
                append(value)
                try:
                    record = dumps(value, protocol)
                    if end + len(record) > CAPACITY or pwrite(fd, record, end) != len(record):
                        raise OSError("no room")
                    end += len(record)
                    done += 1
                    pwrite(fd, pack(done, end), 16)  # the count and the end, in one write
                except BaseException:  # no pickle, a full disk, a short write
                    unrecordable = True
                    break
        finally:
            self._done, self._end = done, end
        if unrecordable:
            self._rest_unrecorded(calls, values)

    def count(self, calls: Iterator[Any], values: list[Any]) -> None:
        if self._stopped:
            values.extend(calls)
            return
        append, pwrite, pack, fd = values.append, os.pwrite, _COUNT_AND_END.pack, self.fd
        done, end = self._done, self._end
        unrecordable = False
        try:
            for value in calls:
                append(value)
                done += 1
                try:
                    pwrite(fd, pack(done, end), 16)
                except OSError:  # (a call closed the descriptor, say)
                    unrecordable = True
                    break
        finally:
            self._done = done
        if unrecordable:  # (out of the except: a later call's error must not chain to it)
            self._rest_unrecorded(calls, values)

    def failure(self, encoded: bytes) -> None:
        if self._stopped:
            return
        try:
            record = pickle.dumps(ItemFailed(encoded), pickle.HIGHEST_PROTOCOL)
            if self._end + len(record) > CAPACITY:
                raise OSError("no room")
            if os.pwrite(self.fd, record, self._end) != len(record):
                raise OSError("a short write")
            self._end += len(record)
            self._done += 1
            os.pwrite(self.fd, _COUNT_AND_END.pack(self._done, self._end), 16)
        except BaseException:
            self._stop()

    def _stop(self) -> None:
        self._stopped = True
        try:
            os.pwrite(self.fd, (1).to_bytes(8, sys.byteorder), 8)
        except OSError:
            pass


_recorder: Recorder | None = None


def recorder() -> Recorder | None:
    """This worker's recorder, made at its first chunk; None outside a worker, in a process
    forked from one (its parent's file is not its own), or where the file could not be
    made or mapped (a death then fails the whole chunk)."""
    global _recorder
    pid = os.getpid()
    if _recorder is not None and _recorder.pid == pid:
        return _recorder
    _recorder = None
    fd = _main._progress_fd
    if fd is None or _main._progress_pid != pid:
        return None
    _main._progress_fd = None  # one try
    if not _main._progress_in_memory:
        _recorder = FileRecorder(fd)
        return _recorder
    try:
        os.ftruncate(fd, CAPACITY)
        mapped = mmap.mmap(fd, CAPACITY)
    except (OSError, ValueError):
        return None
    _recorder = MappedRecorder(fd, mapped)
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
        unpickler = pickle.Unpickler(io.BytesIO(self.records))
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

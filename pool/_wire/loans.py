"""A result's large payloads in a segment: the parent lends each worker one, the worker
writes its result into it, the parent views it.

Owns: ``LoanDesk`` (the parent's side of one worker's loans, and the desk through which
the worker learns which segment it may write) and ``WorkerDesk`` (the worker's side,
``worker_desk``).
Runs in: the dispatcher thread (``LoanDesk``) and the worker (``WorkerDesk``).
Guarantees: a worker writes only into the segment the parent lent it, which the parent
keeps open, so a result the worker sent before dying is still there to read. The parent
checks a result's envelope against that loan (generation, descriptor, inode, extent, and
no page left unwritten) before it maps a byte of it: anything else is ``MalformedFrame``.
A loan is taken back from a worker with nothing in flight, so an idle pool holds none of
that memory. The caller's array views the segment, which is reused once it is gone.
Assumes: a worker reads its desk only as it replies.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from typing import Any

from .frames import Buffers, MalformedFrame
from .payloads import (MARKER, buffers_extent, envelope, layout, load, pickler_for,
                       read_envelope, views_of, write)
from .payloads import extent as extent_of
from . import segments as _segments
from .segments import GROWTH_STEP, MAP_FLAGS, NoRoom, Segment

class LoanDesk:
    """The parent's side of one worker's loans: the segment lent to it for its next large
    result, and the desk (a ``memfd`` of 16 bytes) through which the worker learns which it
    is: ``generation << 32 | descriptor``, then its inode. The dispatcher thread alone
    uses it."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("pool-desk")
        os.ftruncate(self.fd, _DESK.size)
        self.loan: Segment | None = None
        self.generation = 0
        self._hint = 0  # the size of the worker's last large result

    def fds(self) -> list[int]:
        """Its own: the loan is a segment, which a forked child closes with the others
        (``SegmentCache.close_in_child``), once."""
        return [self.fd]

    def lend(self) -> None:
        """Lend the worker a segment for its next large result, if it has none: an idle
        one not much larger than its last large result, or a new one, empty until the
        worker grows it (so an idle worker holds no memory it did not ask for). None if
        this process may not have more: its results go through the pipe until the next."""
        if self.loan is None:
            self._hand_over(_segments.cache.take(self._hint,
                                                 most=2 * self._hint + GROWTH_STEP))

    def take_back(self) -> None:
        """The worker has nothing in flight (so it is not writing into its loan: it reads
        its desk only as it replies): if its loan holds memory, it gets an empty one in
        its place, and the memory goes back to the cache, to be reused or returned to the
        system in time."""
        loan = self.loan
        if loan is not None and loan.size:
            self.loan = None
            _segments.cache.give_back(loan)
            self._hand_over(_segments.cache.take(0, most=0))

    def _hand_over(self, loan: Segment | None) -> None:
        self.loan = loan
        if loan is not None:
            self.generation += 1
            os.pwrite(self.fd, _DESK.pack(self.generation << 32 | loan.fd, loan.ino), 0)

    def load_result(self, body: Any) -> Any:
        """Unpickle a result whose payloads are in the segment lent to this worker, which
        then has none until ``lend``. Raises MalformedFrame if it is not that segment, or
        its payloads lie where the worker never wrote."""
        data = memoryview(body)[len(MARKER):]
        loan = self.loan
        if loan is None:
            raise MalformedFrame("a result in a segment, with none lent")
        size = os.fstat(loan.fd).st_size
        (_, fd, ino, generation), payloads, start = read_envelope(data, size)
        if (fd, ino, generation) != (loan.fd, loan.ino, self.generation):
            raise MalformedFrame(f"a result in segment {fd} (generation {generation}), "
                                 f"not the one lent ({loan.fd}, {self.generation})")
        extent = extent_of(payloads)
        # A hole: pages never written, which mapping would make this process allocate.
        if os.lseek(loan.fd, 0, os.SEEK_HOLE) < min(extent, size):
            raise MalformedFrame(f"a result whose {extent} bytes were never all written")
        self.loan = None
        loan.size = size
        self._hint = extent
        if loan.view is not None:  # it may have grown: mapped again when next written
            loan.view.close()
            loan.view = None
        mapped = buffers_extent(payloads)
        try:
            view = mmap.mmap(loan.fd, mapped, flags=MAP_FLAGS) if mapped else None
        except OSError as exc:  # no address space for it: as a reply with no memory
            _segments.cache.give_back(loan)
            raise NoRoom(f"no memory for a reply of {extent} bytes "
                         f"({type(exc).__name__}: {exc})") from None
        try:
            return load(data[start:], loan.fd, payloads, views_of(view, payloads))
        except MemoryError as exc:  # a bytes payload this process has no room for
            raise NoRoom(f"no memory for a reply of {extent} bytes "
                         f"({type(exc).__name__}: {exc})") from None
        finally:
            if view is None:
                _segments.cache.give_back(loan)  # read out: nothing views it
            else:
                _segments.cache.give_back_when_unviewed(loan, view)

    def close(self, *, worker_gone: bool) -> None:
        """The worker has exited (``worker_gone``: its views went with it, so the loan can
        be reused) or was abandoned (it may still map the loan: it is let go)."""
        if self.loan is not None:
            if not worker_gone:
                self.loan.retired = True  # never reused
            self.loan.size = max(self.loan.size, os.fstat(self.loan.fd).st_size)
            _segments.cache.give_back(self.loan)
            self.loan = None
        os.close(self.fd)
        self.fd = -1


_DESK = struct.Struct("=QQ")  # generation << 32 | descriptor, inode


class WorkerDesk:
    """The worker's side of its loans: reads which segment it may write a result into."""

    def __init__(self, parent_pid: int, desk_fd: int) -> None:
        self.parent_pid, self._desk_fd = parent_pid, desk_fd
        self._fd: int | None = None
        self._used = 0  # the generation of the loan last written into
        self._broken = False

    def loan(self) -> tuple[int, int, int] | None:
        """``(generation, descriptor in the parent, inode)`` of an unused loan, or None."""
        if self._broken:
            return None
        if self._fd is None:
            try:
                self._fd = os.open(f"/proc/{self.parent_pid}/fd/{self._desk_fd}", os.O_RDONLY)
            except OSError:
                self._broken = True  # the parent's descriptors are not ours to open
                return None
        word, ino = _DESK.unpack(os.pread(self._fd, _DESK.size, 0))
        generation = word >> 32
        if generation == 0 or generation == self._used:
            return None
        return generation, word & 0xFFFFFFFF, ino

    def dump_result(self, value: Any, collector: type[list[Any]]) -> Buffers | None:
        """``value`` pickled with its large payloads written into the loan: ``[MARKER and
        envelope, stream parts...]``; None if there is no loan to write into."""
        loan = self.loan()
        if loan is None:
            return None
        generation, fd, ino = loan
        payloads: list[tuple[memoryview, int]] = []
        stream = collector()
        pickler_for(pickle.Pickler)(stream, payloads).dump(value)
        if not payloads:
            return list(stream)
        offsets, end = layout(payloads, 0)
        try:
            target = os.open(f"/proc/{self.parent_pid}/fd/{fd}", os.O_RDWR)
        except OSError:
            return None
        try:
            status = os.fstat(target)
            if status.st_ino != ino:  # not the loan (the desk was read as it changed)
                return None
            if status.st_size < end:
                os.ftruncate(target, -(-end // GROWTH_STEP) * GROWTH_STEP)
            for (payload, _), offset in zip(payloads, offsets):
                write(target, offset, payload)
        finally:
            os.close(target)
        self._used = generation
        return [MARKER + envelope(0, fd, status.st_ino, generation, payloads, offsets),
                *stream]


worker_desk: WorkerDesk | None = None  # set as a worker starts, if its parent lends


def _forget_in_child() -> None:
    global worker_desk
    worker_desk = None  # a task's child is not the worker: it has no loans


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)

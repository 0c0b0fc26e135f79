"""Pipes: the Linux mechanics under the frames (packet mode, a second reader, room for
large frames, what is still unread).

Owns: nothing but these calls; each takes a descriptor its caller owns.
Runs in: the dispatcher thread and its large-frame writer threads; ``PipeRoom`` in the
worker too.
Guarantees: every call degrades to "not available" (False, None, 0, a no-op) where
``_platform`` says the mechanism is missing, or ``POOL_PORTABLE`` turned it off, never to
an exception.
Assumes: Linux semantics where ``_platform`` offers them: ``O_DIRECT`` pipes keep each
write of at most ``PIPE_BUF`` bytes one packet (``PACKET_PIPES``), and FIONREAD answers on
either end (``UNREAD_ON_WRITE_END``); elsewhere, on the read end only.
"""

from __future__ import annotations

import array
import os
import termios

from .. import _platform
from .frames import HEADER, MAGIC

try:
    import fcntl
except ImportError:  # not POSIX: every _platform flag below is False
    pass


# Linux's atomic pipe write, and the size of a packet in a packet-mode pipe.
PIPE_BUF = 4096


def set_packet_mode(fd: int, on: bool) -> bool:
    """Turn packet mode (``O_DIRECT``, Linux 3.4+) on or off for writes through ``fd``.

    In packet mode every write of at most PIPE_BUF bytes stays one packet, and a read takes
    at most one packet. So when a frame is one write, each read takes exactly one frame. A
    second reader, the parent with a read end of a worker's task pipe, can then take back
    the frames the worker has not read, never splitting one. Returns False where pipes have
    no packet mode.
    """
    if not _platform.PACKET_PIPES:  # not Linux, or POOL_PORTABLE
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | os.O_DIRECT) if on else (flags & ~os.O_DIRECT))
    except OSError:
        return False
    return True


def second_reader(read_fd: int) -> int | None:
    """A non-blocking read end of the same pipe, opened again through /proc. A dup would
    not do: the non-blocking flag belongs to the open file, which dups share, so
    ``read_fd`` would turn non-blocking too. None where /proc cannot do it."""
    if not _platform.PROC:
        return None
    try:
        return os.open(f"/proc/self/fd/{read_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def pipe_capacity(fd: int) -> int | None:
    """The pipe's size in bytes, where it can be known (Linux)."""
    if not _platform.PIPE_RESIZE:
        return None
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
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
    two context switches each. With 1 MiB of room it moves about three times as fast:
    measured here, ~1.0 GB/s against ~3.0 GB/s between two processes. The room counts
    against the user's ``pipe-user-pages-soft``, 64 MiB by default, shared by all their
    processes. So a pipe keeps it only while frames larger than ``LARGE_FRAME`` go through.
    It shrinks back before the next small frame, if the reader has emptied it by then.
    Elsewhere than Linux (or with ``POOL_PORTABLE``) this does nothing.
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
                try:  # pipe_capacity knew the size: PIPE_RESIZE
                    fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, self.ROOM)
                    self._usual = usual
                except OSError:
                    pass  # over the user's limit, or above pipe-max-size: stay as it is
        elif self._usual is not None:  # it grew, so PIPE_RESIZE
            try:
                fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, self._usual)
                self._usual = None
            except OSError:
                pass  # EBUSY: it still holds more than that; try again next time


def unread_bytes(fd: int) -> int:
    """Bytes written into a pipe that its reader has not taken (0 where unknown).

    FIONREAD answers on a pipe's read end everywhere. Linux also answers on the write end,
    even after the reader has exited (``_platform.UNREAD_ON_WRITE_END``); BSD and macOS
    answer 0 there, since each end has a buffer of its own and writes land in the other's.
    """
    try:
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return count[0]
    except OSError:
        return 0

"""The streams of ``python -m pool map``: one standard-output line per input, in input
order (or as the inputs finish), the job-log entries that follow them, messages on
standard error, and the read-ahead window that writing lines opens.

Runs in: the command's main thread (``Lines``, ``Messages``, ``Window.give_back``) and its
reader thread (``Window.take``).

Guarantees:
- No write keeps a stop signal waiting (``write.write_or_give_up``). A reader that stopped
  reading (``| less`` left open, a stalled pipe) holds the run up only until a signal
  comes.
- A job-log entry is written only once its input's line has reached standard output. So
  the log never says an input finished whose line was lost: ``--resume`` would skip it.
- Bounded read-ahead: the reader takes a place in the window before each input. The place
  comes back once that input's line is written, or at once if it needs none. So memory
  stays flat however long the input is. Places come back through a SimpleQueue, whose
  ``put`` is one C call: no lock or ``Condition`` is shared (DESIGN, contract 9).
- A failed write of standard output raises one of three exceptions, here only:
  ``OutputClosed`` when the reader has gone (``| head``); ``OutputFailed`` for a full disk
  or an I/O error; ``WriteAbandoned`` when the write was blocked and ``give_up`` said so.
  After the first two, what was not written is dropped, and ``dropped`` holds the entries
  of those inputs. After the third, it is kept for a last try. Writes end at line breaks,
  so giving up tears no line shorter than a pipe's atomic write (``PIPE_BUF``, 4 KiB on
  Linux).
- A failing standard error only loses messages.
"""

from __future__ import annotations

import collections
import os
import queue
import select
import stat
from typing import Callable

from .. import _platform, _shake
from .joblog import Entry, Joblog
from .write import WriteAbandoned, WriteFailed, write_or_give_up

# How long the reader waits for a place at a time, so that it sees ``stopped`` promptly.
_TAKE_SLICE_SECONDS = 0.25
# Lines are written out once this much is buffered (and whenever the run flushes).
_BUFFER_BYTES = 1 << 16


class Window:
    """At most ``size`` inputs read whose lines are not yet written."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.stopped = False                            # set by the main thread: read no more
        self._returned: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._held = 0                                  # the reader's own count

    def take(self) -> bool:
        """Reader thread: wait for a place; False once reading has been stopped."""
        while self._held >= self.size:
            if self.stopped:
                return False
            try:
                self._returned.get(timeout=_TAKE_SLICE_SECONDS)
            except queue.Empty:
                continue
            self._held -= 1
        if self.stopped:
            return False
        self._held += 1
        return True

    def give_back(self) -> None:
        """Main thread: one input's line is written (or it needs none)."""
        self._returned.put(None)


class OutputClosed(Exception):
    """The reader of standard output has gone (EPIPE, or the pipe polls as closed)."""


class OutputFailed(Exception):
    """Standard output cannot be written (no space left, an I/O error)."""


class Lines:
    """Writes each input's line in input order, or at once with ``ordered=False``; then
    its job-log entry, once the line is out. A line of ``None`` stands for an input that
    needs none: one that ``--resume`` skips."""

    def __init__(self, fd: int, window: Window, *, ordered: bool, joblog: Joblog | None,
                 give_up: Callable[[], bool]) -> None:
        self._fd = fd
        self._window = window
        self._ordered = ordered
        self._joblog = joblog
        self._give_up = give_up
        self._next = 1                                  # the next line due, when ordered
        self._due: dict[int, tuple[str | None, Entry | None]] = {}  # waiting for their turn
        self._buffer = bytearray()                      # lines not yet written
        self._consumed = 0                              # bytes written before the buffer
        # The entries of the buffered lines, each with where its line ends (counted from
        # the first byte ever written): logged once the output has got that far.
        self._pending: collections.deque[tuple[int, Entry]] = collections.deque()
        self._closed_by_reader = _pipe_watch(fd)
        self._abandoned = False
        self.dropped: list[Entry] = []                  # finished, but the line was lost

    @property
    def unwritten(self) -> bool:
        return bool(self._buffer)

    def put(self, seq: int, line: str | None, entry: Entry | None = None) -> None:
        if not self._ordered:
            self._add(line, entry)
            return
        self._due[seq] = (line, entry)
        while self._next in self._due:
            self._add(*self._due.pop(self._next))
            self._next += 1

    def put_the_rest(self) -> None:
        """At an early end: the lines of what finished, in order, past the gaps."""
        for seq in sorted(self._due):
            self._add(*self._due.pop(seq))

    def flush(self) -> None:
        """Everything buffered to standard output, and the entries of what got out to the
        job log."""
        if self._abandoned:
            return
        if self._closed_by_reader is not None and self._closed_by_reader():
            self.abandon()
            raise OutputClosed
        if _shake.on:
            _shake.pause("cli.before_write")
        try:
            write_or_give_up(self._fd, self._buffer, self._give_up)
        except WriteAbandoned as exc:   # the rest is kept: the run may try again
            self._out(exc.written)
            raise
        except WriteFailed as exc:
            self._out(exc.written)
            self.abandon()
            if isinstance(exc.error, BrokenPipeError):
                raise OutputClosed from None
            raise OutputFailed(exc.error.strerror or str(exc.error)) from exc.error
        self._out(len(self._buffer))

    def _out(self, written: int) -> None:
        """``written`` bytes of the buffer reached the output: log the entries of the
        lines that did."""
        del self._buffer[:written]
        self._consumed += written
        logged = []
        while self._pending and self._pending[0][0] <= self._consumed:
            logged.append(self._pending.popleft()[1])
        if logged and self._joblog is not None:
            self._joblog.write(logged, self._give_up)

    def _add(self, line: str | None, entry: Entry | None) -> None:
        self._window.give_back()
        if line is not None:
            self._buffer += (line + "\n").encode("utf-8", "surrogateescape")
        if entry is not None:
            self._pending.append((self._consumed + len(self._buffer), entry))
        if len(self._buffer) >= _BUFFER_BYTES:
            self.flush()

    def abandon(self) -> None:
        """Drops what could not be written, with its entries: as far as ``--resume``
        knows, those inputs did not finish. Nothing more is written."""
        self._abandoned = True
        self._buffer.clear()
        self.dropped.extend(entry for _, entry in self._pending)
        self._pending.clear()


class Messages:
    """Standard error, a message at a time. Never fatal: a closed or broken standard error
    loses the messages. One that nobody reads holds the run up only until ``give_up``."""

    def __init__(self, fd: int | None, give_up: Callable[[], bool]) -> None:
        self._fd = fd
        self._give_up = give_up

    def write(self, text: str) -> None:
        if self._fd is None:
            return
        try:
            write_or_give_up(self._fd, text.encode("utf-8", "backslashreplace"), self._give_up)
        except (OSError, WriteAbandoned, WriteFailed):
            pass

    def flush(self) -> None:
        pass   # nothing is buffered

    def isatty(self) -> bool:
        return self._fd is not None and os.isatty(self._fd)


def _pipe_watch(fd: int) -> Callable[[], bool] | None:
    """On Linux, the write end of a pipe whose reader is gone polls as an error: the run
    then ends at once, not at its next line (``| head`` while long inputs run). Elsewhere
    (``_platform.POLL_READER_GONE``) the closed pipe is found at the next write."""
    try:
        if not _platform.POLL_READER_GONE or not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except OSError:
        return None
    poller = select.poll()
    poller.register(fd, select.POLLERR)

    def closed() -> bool:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    return closed


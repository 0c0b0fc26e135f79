"""The streams of ``python -m pool map``: one standard-output line per input, in input
order (or as the inputs finish), the job-log entries that follow them, messages on
standard error, and the read-ahead window that writing lines opens.

Runs in: the command's main thread (``Lines``, ``Messages``, ``Window.give_back``) and its
reader thread (``Window.take``).

Guarantees:
- No write can keep a stop signal waiting. Every write waits for the descriptor in slices
  (``poll``, then at most what the descriptor takes without blocking), and between slices
  asks ``give_up``: a reader that stopped reading (``| less`` left open, a stalled pipe)
  holds the run up only until a signal comes.
- A job-log entry is written only once its input's line has reached standard output, so
  the log never says an input finished whose line was lost (``--resume`` would skip it).
- Bounded read-ahead: the reader takes a place in the window before each input, and a
  place is given back when that input's line is written (or it needs none), so memory
  stays flat however long the input is. No lock or ``Condition`` is shared: places come
  back through a SimpleQueue, whose ``put`` is one C call (DESIGN, contract 9).
- A failed write of standard output is one of three exceptions, raised here only:
  ``OutputClosed`` (the reader has gone: ``| head``) or ``OutputFailed`` (a full disk, an
  I/O error), after which what was not written is dropped; or ``WriteAbandoned``
  (blocked, and ``give_up`` said so), after which it is kept for a last try.
  Standard error failing only loses messages.
"""

from __future__ import annotations

import os
import queue
import select
import stat
from typing import Callable

from ._cli_joblog import Entry, Joblog

# How long the reader waits for a place at a time, so that it sees ``stopped`` promptly.
_TAKE_SLICE_SECONDS = 0.25
# How long a write waits for the descriptor before it asks whether to give up.
_WRITE_SLICE_MS = 100
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


class WriteAbandoned(Exception):
    """A write was blocked and ``give_up`` said to stop waiting; ``written`` bytes of it
    had been written."""

    def __init__(self, written: int) -> None:
        super().__init__(written)
        self.written = written


def write_all(fd: int, data: bytes | bytearray, give_up: Callable[[], bool]) -> None:
    """All of ``data`` to ``fd``, never blocked for longer than a slice at a time.
    Raises WriteAbandoned (saying how much was written) or OSError."""
    written = 0
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    # What one write takes without blocking once poll says writable: a pipe or socket
    # guarantees PIPE_BUF; a file or terminal takes a block.
    piece = select.PIPE_BUF if _is_pipe_or_socket(fd) else _BUFFER_BYTES
    with memoryview(data) as whole:   # (released on the way out: the caller resizes data)
        while written < len(whole):
            if not poller.poll(_WRITE_SLICE_MS):
                if give_up():
                    raise WriteAbandoned(written)
                continue
            try:
                with whole[written:written + piece] as part:
                    written += os.write(fd, part)
            except BlockingIOError:
                continue


def _is_pipe_or_socket(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class Lines:
    """Writes each input's line when its turn comes (input order), or at once
    (``ordered=False``), then its job-log entry. A line of ``None`` stands for an input
    that needs none (resumed past)."""

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
        self._entries: list[Entry] = []                 # their job-log entries
        self._closed_by_reader = _pipe_watch(fd)
        self._abandoned = False

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
        """Everything buffered to standard output, then its entries to the job log."""
        if self._abandoned:
            return
        if self._closed_by_reader is not None and self._closed_by_reader():
            self.abandon()
            raise OutputClosed
        try:
            write_all(self._fd, self._buffer, self._give_up)
        except WriteAbandoned as exc:   # (kept: the run may try again as it ends)
            del self._buffer[:exc.written]
            raise
        except BrokenPipeError:
            self.abandon()
            raise OutputClosed from None
        except OSError as exc:
            self.abandon()
            raise OutputFailed(exc.strerror or str(exc)) from exc
        self._buffer.clear()
        entries, self._entries = self._entries, []
        if self._joblog is not None:
            for entry in entries:
                self._joblog.write(entry)

    def _add(self, line: str | None, entry: Entry | None) -> None:
        self._window.give_back()
        if line is not None:
            self._buffer += (line + "\n").encode("utf-8", "surrogateescape")
        if entry is not None:
            self._entries.append(entry)
        if len(self._buffer) >= _BUFFER_BYTES:
            self.flush()

    def abandon(self) -> None:
        """What could not be written is dropped, and its entries with it (those inputs
        did not finish, as far as ``--resume`` knows); nothing more is written."""
        self._abandoned = True
        self._buffer.clear()
        self._entries.clear()


class Messages:
    """Standard error, a message at a time; never fatal: a closed or broken standard error
    loses the messages, and one nobody reads holds the run up only until ``give_up``."""

    def __init__(self, fd: int | None, give_up: Callable[[], bool]) -> None:
        self._fd = fd
        self._give_up = give_up

    def write(self, text: str) -> None:
        if self._fd is None:
            return
        try:
            write_all(self._fd, text.encode("utf-8", "backslashreplace"), self._give_up)
        except (OSError, WriteAbandoned):
            pass

    def flush(self) -> None:
        pass   # (nothing is buffered)

    def isatty(self) -> bool:
        try:
            return self._fd is not None and os.isatty(self._fd)
        except OSError:
            return False


def _pipe_watch(fd: int) -> Callable[[], bool] | None:
    """On Linux, the write end of a pipe whose reader is gone polls as an error: the run
    then ends at once, not at its next line (``| head`` while long inputs run). Elsewhere
    the closed pipe is found at the next write."""
    try:
        if not hasattr(select, "poll") or not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except OSError:
        return None
    poller = select.poll()
    poller.register(fd, select.POLLERR)

    def closed() -> bool:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    return closed


"""The standard output of ``python -m pool map``: one line per input, in input order (or as
the inputs finish), and the read-ahead window that writing them opens.

Runs in: the command's main thread (``Lines``, ``Window.give_back``) and its reader thread
(``Window.take``).

Guarantees:
- Bounded read-ahead: the reader takes a place in the window before each input and a place
  is given back when that input's line is written (or the input is skipped), so memory
  stays flat however long the input is, and a slow input holds back at most ``size``
  others. No lock or ``Condition`` is shared: places come back through a SimpleQueue, whose
  ``put`` is one C call a Ctrl-C cannot split (DESIGN, contract 9).
- A failed write is one of two exceptions, raised here and nowhere else: ``OutputClosed``
  (the reader of the pipe has gone: ``| head``) or ``OutputFailed`` (a full disk, an I/O
  error). After either, ``abandon`` points the descriptor at ``/dev/null``, so that no
  later flush (ours or the interpreter's at exit) prints a traceback.
"""

from __future__ import annotations

import os
import queue
import select
import stat
from typing import IO, Callable

# How long the reader waits for a place at a time, so that it sees ``stopped`` promptly.
_TAKE_SLICE_SECONDS = 0.25


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
    """Writes each input's line when its turn comes (input order), or at once
    (``ordered=False``). ``None`` stands for an input that has no line (resumed past)."""

    def __init__(self, stream: IO[bytes], window: Window, *, ordered: bool) -> None:
        self._stream = stream
        self._window = window
        self._ordered = ordered
        self._next = 1                                  # the next line due, when ordered
        self._due: dict[int, str | None] = {}           # finished, waiting for their turn
        self._closed_by_reader = _pipe_watch(stream)
        self.unwritten = 0                              # lines written but not flushed

    def put(self, seq: int, line: str | None) -> None:
        if not self._ordered:
            self._write(line)
            return
        self._due[seq] = line
        while self._next in self._due:
            self._write(self._due.pop(self._next))
            self._next += 1

    def put_the_rest(self) -> None:
        """At an early end: the lines of what finished, in order, past the gaps."""
        for seq in sorted(self._due):
            self._write(self._due.pop(seq))

    def flush(self) -> None:
        if self._closed_by_reader is not None and self._closed_by_reader():
            raise OutputClosed
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise OutputClosed from None
        except OSError as exc:
            raise OutputFailed(exc.strerror or str(exc)) from exc
        self.unwritten = 0

    def abandon(self) -> None:
        """After OutputClosed or OutputFailed: drop what is buffered, quietly."""
        try:
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
            self._stream.close()
        except (OSError, ValueError):
            pass

    def _write(self, line: str | None) -> None:
        self._window.give_back()
        if line is None:
            return
        try:
            self._stream.write((line + "\n").encode("utf-8", "surrogateescape"))
        except BrokenPipeError:
            raise OutputClosed from None
        except OSError as exc:
            raise OutputFailed(exc.strerror or str(exc)) from exc
        self.unwritten += 1


def _pipe_watch(stream: IO[bytes]) -> Callable[[], bool] | None:
    """On Linux, the write end of a pipe whose reader is gone polls as an error: the run
    then ends at once, not at its next line (``| head`` while long inputs run). Elsewhere
    the closed pipe is found at the next write."""
    try:
        fd = stream.fileno()
        if not hasattr(select, "poll") or not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    poller = select.poll()
    poller.register(fd, select.POLLERR)

    def closed() -> bool:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    return closed

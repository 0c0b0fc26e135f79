"""The events of a ``python -m pool map`` run, and what posts them from beside the main
thread: the reader of the inputs, the counter of their total, and the done-callback of
each job.

Owns: the event queue's type (``Events``), the reader and counter threads
(``InputReader``) and the done-callback (``post_done``).
Runs in: the reader thread (``pool-map-reader``), the counter thread (``pool-map-counter``,
with ``--progress`` on a file) and whichever thread completes a job's future. The main
thread makes them and takes the events.
Guarantees: none of them decides or writes anything; each only puts ``(kind, value)``
events on one SimpleQueue, whose ``put`` is one C call:
- the reader puts ``("input", Input)`` for each input, in order, then ``("eof", None)``, or
  ``("read_error", exception)`` when the input cannot be read on. It takes a place in the
  window before each input, so memory stays flat however long the input (bounded
  read-ahead). Once the window is stopped, it stops at its next place: only an input it
  was reading then still comes.
- the counter puts ``("total", count)`` once, or nothing if counting failed.
- a job's done-callback puts ``("done", future)``.
Assumes: the main thread takes the events, and gives each input's place in the window
back once its line is written or it needs none.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterator

from .. import _shake
from .inputs import Input
from .lines import Window

Events = queue.SimpleQueue[tuple[str, Any]]


class InputReader:
    """The threads that read beside the main thread: the inputs and, for the progress line,
    their total."""

    def __init__(self, events: Events, inputs: Iterator[Input], window: Window,
                 count: Callable[[], int | None] | None) -> None:
        self.events = events
        self.window = window
        self.reader = threading.Thread(target=self._read, args=(inputs,), daemon=True,
                                       name="pool-map-reader")
        self.counter = (threading.Thread(target=self._count_total, args=(count,),
                                         daemon=True, name="pool-map-counter")
                        if count is not None else None)

    def start(self) -> None:
        self.reader.start()
        if self.counter is not None:
            self.counter.start()

    def _read(self, inputs: Iterator[Input]) -> None:
        try:
            while self.window.take():
                if _shake.on:
                    _shake.pause("cli.reader_next")
                item = next(inputs, None)
                if item is None:
                    self.events.put(("eof", None))
                    return
                self.events.put(("input", item))
        except BaseException as exc:  # an unreadable input ends the run, with the reason
            self.events.put(("read_error", exc))

    def _count_total(self, count: Callable[[], int | None]) -> None:
        try:
            self.events.put(("total", count()))
        except Exception:
            pass  # the progress line goes without a total


def post_done(events: Events) -> Callable[[Future[Any]], None]:
    """A done-callback that posts the finished future as a ``("done", future)`` event."""
    def done(future: Future[Any]) -> None:
        events.put(("done", future))
    return done

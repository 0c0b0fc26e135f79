"""How a run of ``python -m pool map`` ends: the stop signals it holds while it runs, why it
ended, and what it says about that on standard error.

Owns: the handlers of the stop signals (SIGINT, SIGTERM, SIGHUP) while the run holds them,
the signals received, whether a blocked write gives up (``give_up``), the reason for
standard error when the run ended early (``problem``), the ``End`` an exception means, and
the closing messages.
Runs in: the command's main thread; the signal handlers run there too.
Guarantees:
- Signals are events: the handlers only count and post them, so no exception lands
  inside the pool's code or ours (DESIGN, contract 9). The run answers them at its loop's
  next turn.
- A signal the command inherited as ignored (``nohup``, a background job) stays ignored.
  The handlers found are put back once the run is over.
- A blocked write asks ``give_up`` between slices (``write.write_or_give_up``). While the
  run goes on, a signal ends the wait at once. While the run ends (``winding_up``), the
  lines of what finished get ``_LAST_WRITES_SECONDS`` after the first signal, and one more
  signal gives up on writing what is left.
Assumes: it is the main thread, where signals land.
"""

from __future__ import annotations

import enum
import signal
import time
import traceback
from typing import Any, NamedTuple

from . import output
from .. import _shake
from .joblog import JoblogError
from .lines import OutputClosed, OutputFailed
from .map_events import Events
from .results import Results
from .write import WriteAbandoned

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# After a stop signal, how long a reader that is slow to take the last lines is waited for.
_LAST_WRITES_SECONDS = 2.0


class End(enum.Enum):
    """Why the run ended."""
    DONE = "every input finished"
    HALT = "--halt"
    SIGNAL = "a signal"
    OUTPUT_CLOSED = "standard output was closed"
    OUTPUT_FAILED = "standard output could not be written"
    JOBLOG = "the job log could not be used"
    READ_ERROR = "the input could not be read"
    INTERNAL = "an internal error"


class RunSummary(NamedTuple):
    """What the run did and why it ended: the exit status is made from it."""
    ok: int
    failed: int
    not_finished: int     # inputs read (ahead, queued or running) that got no outcome
    end: End
    signum: int = 0


class RunEnding:
    """The stop signals of one run, and why and how it ended."""

    def __init__(self, events: Events) -> None:
        self.events = events
        # Every stop signal received, in order. Only ever appended to: the run's jobs read
        # this same list.
        self.signals: list[int] = []
        self.first_signal_at = 0.0        # time.monotonic() of the first
        self.winding_up = False
        self.problem: str | None = None   # why the run ended early, for stderr
        self._previous: dict[int, Any] = {}

    def hold_signals(self) -> None:
        self._previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum, handler in self._previous.items():
            if handler is not signal.SIG_IGN:   # nohup's SIGHUP stays ignored
                signal.signal(signum, self._on_signal)

    def release_signals(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only appends and a SimpleQueue put: nothing a signal could split.
        if not self.signals:
            self.first_signal_at = time.monotonic()
        self.signals.append(signum)
        if _shake.on:
            _shake.pause("cli.after_signal")
        self.events.put(("signal", signum))

    def give_up(self) -> bool:
        """Whether a blocked write stops waiting. While the run goes on: once a signal
        came, since the loop must answer it. While the run ends: the lines of what
        finished get ``_LAST_WRITES_SECONDS`` after the first signal, or until a second."""
        if not self.signals:
            return False
        if not self.winding_up:
            return True
        return (len(self.signals) > 1
                or time.monotonic() - self.first_signal_at >= _LAST_WRITES_SECONDS)

    def end_of(self, exc: BaseException) -> End:
        """The End an exception means; sets the message that says so."""
        if isinstance(exc, OutputClosed):
            return End.OUTPUT_CLOSED
        if isinstance(exc, WriteAbandoned):
            return End.SIGNAL   # blocked writing when a signal came
        if isinstance(exc, OutputFailed):
            self.problem = f"pool map: cannot write standard output: {exc}; stopped"
            return End.OUTPUT_FAILED
        if isinstance(exc, JoblogError):
            self.problem = f"pool map: {exc}; stopped"
            return End.JOBLOG
        if not isinstance(exc, Exception):
            raise exc   # SystemExit and the like: not ours to explain
        self.problem = ("pool map: internal error (a bug in pool; please report it); the "
                        "workers were stopped:\n" + "".join(traceback.format_exception(exc))
                        ).rstrip()
        return End.INTERNAL

    def report(self, results: Results, end: End, not_finished: int) -> None:
        """The closing messages on standard error: the problem, the summary line that
        follows a progress line, and what a signal interrupted."""
        if self.problem:
            results.note(self.problem)
        progress = results.progress
        if progress is not None and end is not End.OUTPUT_CLOSED:
            results.note(output.summary_line(results.ok, results.failed, progress.elapsed(),
                                             not_finished))
        if end is End.SIGNAL:
            counts = f"{results.ok} ok, {results.failed} failed, {not_finished} not finished"
            signum = self.signals[0] if self.signals else signal.SIGINT
            if signum == signal.SIGINT:
                results.note(f"pool map: interrupted ({counts})")
            else:
                results.note(f"pool map: stopped by {signal.Signals(signum).name} ({counts})")

"""What ``python -m pool map`` writes: one standard-output line per input, and on standard
error what the function printed, the failures, and the progress line.

Runs in: the command's main thread (the only writer of both streams).
Guarantees: each line on standard output is exactly one input's: line breaks inside a
result are written as ``\\n`` and ``\\r``. In the plain form a failed input's line starts
with ``!`` and a result's never does: a result that starts with ``!`` gets a backslash
before it. So ``grep -v '^!'`` keeps exactly the results. ``--json`` is lossless.

``--json`` writes one object per input, on one line:
``{"seq": N, "input": I, "ok": true, "value": V}`` or
``{"seq": N, "input": I, "ok": false, "error": {"type": T, "message": M, "kind": K, ...}}``.
``seq`` is the input's position (1-based). ``input`` is what the function was given: the
line as read, or the value it was parsed into (``--parse``, ``--jsonl``); a line that could
not be parsed, as read. ``value`` is the result, as JSON (its ``repr`` where JSON cannot
hold it). ``type`` is the exception's class name (``WorkerDied``, ``TaskTimeout`` for a
death or timeout); ``message`` is its message alone, ``str(exc)``, never repeating the type;
``kind`` is the job log's Outcome: ``error``, ``died``, ``timeout`` or ``invalid`` (an input
that could not be parsed, never run). ``exitcode``, ``signal`` and ``pid`` follow when
known: 1 for an exception, a dead worker's exit code or signal (``SIGKILL`` for a timeout).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, NamedTuple, Protocol

from .joblog import escape
from .task import message, to_json
from .._errors import TaskTimeout, WorkerDied, describe_exit


class Failure(NamedTuple):
    """Why an input failed, in the terms the output and the job log use."""
    kind: str           # "error", "died", "timeout" or "invalid": the job log's Outcome
    error_type: str     # "ValueError", "WorkerDied", ...: the job log's Error
    message: str        # the message alone, as str(exc) gives it: "invalid literal ..."
    detail: str         # what stderr shows below the summary (traceback, crash report)
    exitcode: int | None = None   # 1 for an exception (as ``python`` exits), a death's code
    signal: str | None = None     # "SIGSEGV"; "SIGKILL" for a timeout
    pid: int | None = None

    @property
    def summary(self) -> str:
        """For people, on one line: ``ValueError: invalid literal ...``, as Python shows
        an exception (the type alone if the message is empty)."""
        message = " ".join(self.message.split())
        return f"{self.error_type}: {message}" if message else self.error_type


def failure_of(error: BaseException) -> Failure:
    """A failure of the whole job, raised by the pool, in the output's terms."""
    if isinstance(error, WorkerDied):
        # A death by a signal has no exit code: the Signal column names the signal.
        code = error.exitcode if error.exitcode is not None and error.exitcode >= 0 else None
        return Failure("died", "WorkerDied",
                       f"worker pid {error.pid} died ({describe_exit(error.exitcode)})",
                       without_our_frames(error.crash_report or ""), code,
                       error.signal_name, error.pid)
    if isinstance(error, TaskTimeout):
        where = ("Where it was when the time ran out:\n"
                 + without_our_frames(error.stack).rstrip()
                 if error.stack else "(the worker did not write its stack in time)")
        return Failure("timeout", "TaskTimeout",
                       f"ran longer than {error.timeout:g} s (worker pid {error.pid} killed)",
                       where, None, "SIGKILL", error.pid)
    text = message(error)
    # The summary holds a one-line message whole: only more lines say more below it.
    return Failure("error", type(error).__name__, text, text if "\n" in text.strip() else "")


def without_our_frames(stack: str) -> str:
    """A worker's stack without the frames of the code that calls the user's function,
    which say nothing about the input."""
    return "".join(line for line in stack.splitlines(keepends=True)
                   if _TASK_FILE not in line)


# The file of ``task``, which calls the user's function in the worker.
_TASK_FILE = os.path.join(os.sep + "_cli", "task.py")


def one_line(text: str) -> str:
    return text.replace("\n", "\\n").replace("\r", "\\r")


def plain_result(text: str) -> str:
    text = one_line(text)
    return "\\" + text if text.startswith("!") else text


def plain_failure(failure: Failure) -> str:
    return "!" + one_line(failure.summary)


def tagged(input_text: str, line: str) -> str:
    return f"{escape(input_text)}\t{line}"


def json_result(seq: int, input_value: Any, value_json: str) -> str:
    return (f'{{"seq": {seq}, "input": {to_json(input_value)}, "ok": true, '
            f'"value": {value_json}}}')


def json_failure(seq: int, input_value: Any, failure: Failure) -> str:
    error: dict[str, Any] = {"type": failure.error_type, "message": failure.message,
                             "kind": failure.kind}
    if failure.exitcode is not None:
        error["exitcode"] = failure.exitcode
    if failure.signal is not None:
        error["signal"] = failure.signal
    if failure.pid is not None:
        error["pid"] = failure.pid
    return (f'{{"seq": {seq}, "input": {to_json(input_value)}, "ok": false, '
            f'"error": {to_json(error)}}}')


class TextSink(Protocol):
    def write(self, text: str, /) -> Any: ...
    def flush(self) -> Any: ...


class ProgressLine:
    """The ``--progress`` line on standard error: a bar redrawn in place on a terminal, a
    plain line every ``interval`` seconds otherwise, and a summary at the end."""

    def __init__(self, stream: TextSink, *, tty: bool, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._tty, self._clock = stream, tty, clock
        self._interval = 0.1 if tty else interval
        self._started = clock()
        self._last = self._started
        self._drawn = False

    def elapsed(self) -> float:
        return self._clock() - self._started

    def tick(self, ok: int, failed: int, running: int, total: int | None) -> None:
        now = self._clock()
        if now - self._last < self._interval:
            return
        self._last = now
        line = self.describe(ok, failed, running, total, now - self._started)
        if self._tty:
            self._stream.write("\r\x1b[K" + line)
            self._drawn = True
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def clear(self) -> None:
        """Erases the bar before other text goes to the terminal; the next tick redraws."""
        if self._drawn:
            self._stream.write("\r\x1b[K")
            self._drawn = False
            self._last = -math.inf

    @staticmethod
    def describe(ok: int, failed: int, running: int, total: int | None,
                 elapsed: float) -> str:
        done = ok + failed
        rate = done / elapsed if elapsed > 0 else 0.0
        of = f"/{total}" if total is not None else ""
        parts = [f"{done}{of} done", f"{failed} failed", f"{running} running",
                 f"{rate:.1f}/s"]
        if total is not None and rate > 0:
            parts.append(f"ETA {_clock_time((total - done) / rate)}")
        else:
            parts.append("ETA ?")
        text = ", ".join(parts)
        if total:
            width = 20
            filled = min(width, width * done // total)
            text = f"[{'#' * filled}{'.' * (width - filled)}] {text}"
        return text


def summary_line(ok: int, failed: int, elapsed: float, not_finished: int = 0) -> str:
    """``not_finished``: inputs read (ahead, waiting or running) that the run's early end
    left without an outcome."""
    text = f"{ok} ok, {failed} failed"
    if not_finished:
        text += f", {not_finished} not finished"
    return f"{text}, {elapsed:.1f} s"


def _clock_time(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"

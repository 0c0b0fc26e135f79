"""The job log of ``python -m pool map --joblog FILE``, and reading it back for
``--resume`` / ``--resume-failed``.

Runs in: the command's main thread.
Format: tab-separated: a line of column names, then one line per finished input. Each line
is written to the file as its input finishes, so the log of a run that was interrupted,
killed or halted is complete up to that moment. Columns:

``Seq``       the input's position (1-based)
``Start``     when it started, in seconds since the epoch. For a worker death or a
              timeout, when it was handed to the pool: the worker could not say.
``Runtime``   seconds
``Outcome``   ``ok``, ``error`` (an exception), ``died`` (the worker died), ``timeout``,
              or ``invalid`` (an input that could not be parsed, never run)
``Exitcode``  0 ok, 1 exception (as an uncaught one ends ``python``), the worker's exit
              code for a death, ``-`` otherwise
``Signal``    the signal that ended the worker (``SIGSEGV``; ``SIGKILL`` for a timeout), or ``-``
``Pid``       the worker's pid, or ``-``
``Attempts``  how many times it ran (``--retries``)
``Error``     the error's type, or ``-``
``Input``     the input as read, with backslash, tab, CR and LF escaped

An input that was stopped because the run ended (``--halt now``, Ctrl-C, a closed output
pipe) did not finish: it is not logged, and ``--resume`` runs it again.
"""

from __future__ import annotations

import array
import os
from typing import Callable, Iterator, NamedTuple

from .write import WriteFailed, write_or_give_up

COLUMNS = ("Seq", "Start", "Runtime", "Outcome", "Exitcode", "Signal", "Pid", "Attempts",
          "Error", "Input")


class Entry(NamedTuple):
    seq: int
    start: float
    runtime: float
    outcome: str
    exitcode: int | None
    signal: str | None
    pid: int | None
    attempts: int
    error: str
    input: str


class JoblogError(Exception):
    """The job log cannot be read back, or was written for other inputs."""


def escape(text: str) -> str:
    """One line, reversibly: backslash, tab, CR and LF as two-character escapes."""
    return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


class Joblog:
    """The job log, open for appending. Every failure to write is a JoblogError. A write
    blocked until ``give_up`` says so raises ``write.WriteAbandoned``."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self._path = path

    @classmethod
    def open(cls, path: str, *, append: bool) -> Joblog:
        """A new log at ``path``; with ``append``, the end of one being resumed. A torn
        last line, left by a run killed while writing it, is cut off first: the new
        entries start on a line of their own."""
        try:
            if append:
                _cut_torn_line(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                         | (0 if append else os.O_TRUNC), 0o666)
        except OSError as exc:
            raise JoblogError(f"cannot write the job log {path}: {exc.strerror}") from exc
        log = cls(fd, path)
        if not append:
            try:
                log._put("\t".join(COLUMNS) + "\n", _never)
            except JoblogError:
                log.close()
                raise
        return log

    def write(self, entries: list[Entry], give_up: Callable[[], bool]) -> None:
        self._put("".join(_line(entry) for entry in entries), give_up)

    def _put(self, text: str, give_up: Callable[[], bool]) -> None:
        try:
            write_or_give_up(self._fd, text.encode("utf-8", "surrogateescape"), give_up)
        except WriteFailed as exc:
            raise JoblogError(f"cannot write the job log {self._path}: "
                              f"{exc.error.strerror or exc.error}") from exc.error

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def _line(entry: Entry) -> str:
    fields = (str(entry.seq), f"{entry.start:.3f}", f"{entry.runtime:.3f}", entry.outcome,
              _or_dash(entry.exitcode), entry.signal or "-", _or_dash(entry.pid),
              str(entry.attempts), entry.error or "-", escape(entry.input))
    return "\t".join(fields) + "\n"


def _never() -> bool:
    return False


def _or_dash(number: int | None) -> str:
    return "-" if number is None else str(number)


def _cut_torn_line(path: str) -> None:
    with open(path, "rb+") as stream:
        end = stream.seek(0, 2)
        if end == 0:
            return
        stream.seek(end - 1)
        if stream.read(1) == b"\n":
            return
        while end > 0:   # back a block at a time to the last line break
            start = max(0, end - (1 << 16))
            stream.seek(start)
            newline = stream.read(end - start).rfind(b"\n")
            if newline >= 0:
                stream.truncate(start + newline + 1)
                return
            end = start
        stream.truncate(0)


class Finished(NamedTuple):
    """What a job log says about one input: its last outcome, and the input it was for."""
    ok: bool
    escaped_input: str


# An entry's Seq beyond this many times its line number, plus read-ahead's worth, is not
# from a run of this command. It is refused before it could make the tables below huge.
_SEQ_PER_LINE = 10
_SEQ_SLACK = 10_000_000

_NOT_LOGGED, _FAILED, _OK = 0, 1, 2


class Logged:
    """What a job log says finished, per Seq: its last outcome, a hash of its input and
    where its line is. Compact (17 bytes an input), so resuming a run of millions of
    inputs stays as small as the run; the input itself is read back only when asked."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._outcome = bytearray()          # by Seq: _NOT_LOGGED, _FAILED or _OK
        self._input_hash = array.array("q")  # by Seq: hash() of its escaped input
        self._offset = array.array("q")      # by Seq: where its last entry starts

    def record(self, seq: int, ok: bool, escaped_input: str, offset: int) -> None:
        missing = seq + 1 - len(self._outcome)
        if missing > 0:
            self._outcome.extend(bytes(missing))
            self._input_hash.extend([0] * missing)
            self._offset.extend([0] * missing)
        self._outcome[seq] = _OK if ok else _FAILED
        self._input_hash[seq] = hash(escaped_input)
        self._offset[seq] = offset

    def __iter__(self) -> Iterator[int]:
        return (seq for seq, outcome in enumerate(self._outcome) if outcome != _NOT_LOGGED)

    def outcome(self, seq: int) -> bool | None:
        """True (ok), False (failed) or None (not logged)."""
        if seq >= len(self._outcome) or self._outcome[seq] == _NOT_LOGGED:
            return None
        return self._outcome[seq] == _OK

    def matches(self, seq: int, escaped_input: str) -> bool:
        """Whether the logged input ``seq`` is this one (by hash: this is per input)."""
        return self._input_hash[seq] == hash(escaped_input)

    def __getitem__(self, seq: int) -> Finished:
        ok = self.outcome(seq)
        if ok is None:
            raise KeyError(seq)
        with open(self._path, "rb") as stream:
            stream.seek(self._offset[seq])
            line = stream.readline().decode("utf-8", "surrogateescape")
        return Finished(ok, line.rstrip("\n").split("\t")[-1])


class Resume:
    """What ``--resume`` (or, with ``rerun_failed``, ``--resume-failed``) skips."""

    def __init__(self, logged: Logged, *, rerun_failed: bool) -> None:
        self._logged = logged
        self._rerun_failed = rerun_failed

    def skips(self, seq: int, text: str) -> bool:
        """Whether input ``seq`` finished in the logged run and is not to run again.
        Raises JoblogError if the log says that input was another."""
        ok = self._logged.outcome(seq)
        if ok is None:
            return False
        escaped = escape(text)
        if not self._logged.matches(seq, escaped):
            raise JoblogError(
                f"the job log was written for other inputs: input {seq} is "
                f"{escaped!r} here, {self._logged[seq].escaped_input!r} in the log")
        return ok or not self._rerun_failed


def read_joblog(path: str) -> Logged:
    """What the log at ``path`` says finished. Raises JoblogError for a file that is not a
    job log of this command."""
    logged = Logged(path)
    try:
        with open(path, "rb") as stream:
            first = stream.readline()
            if tuple(_text(first).rstrip("\n").split("\t")) != COLUMNS:
                raise JoblogError(f"{path} is not a job log of python -m pool map "
                                  f"(its first line is not the header)")
            offset = len(first)
            for number, raw in enumerate(stream, start=2):
                if not raw.endswith(b"\n"):
                    break  # the last line of a run killed while writing it: not finished
                fields = _text(raw)[:-1].split("\t")
                if (len(fields) != len(COLUMNS) or not fields[0].isascii()
                        or not fields[0].isdigit()):
                    raise JoblogError(f"{path}, line {number}: not a job log entry")
                seq = int(fields[0])
                if seq > _SEQ_PER_LINE * number + _SEQ_SLACK:
                    raise JoblogError(f"{path}, line {number}: Seq {seq} is out of range")
                logged.record(seq, fields[3] == "ok", fields[-1], offset)
                offset += len(raw)
    except OSError as exc:
        raise JoblogError(f"cannot read the job log: {exc}") from exc
    return logged


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")

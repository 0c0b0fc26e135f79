"""The job log of ``python -m pool map --joblog FILE``, and reading it back for
``--resume`` / ``--resume-failed``.

Runs in: the command's main thread. Format: tab-separated, a header line, then one line per
finished input, written (and flushed) as the input finishes, so that the log of a run that
was interrupted, killed or halted is complete up to that moment. Columns:

``Seq``       the input's position (1-based)
``Start``     when it started, seconds since the epoch (for a worker death or a timeout,
              when it was handed to the pool: the worker could not say)
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

from typing import IO, NamedTuple

HEADER = ("Seq", "Start", "Runtime", "Outcome", "Exitcode", "Signal", "Pid", "Attempts",
          "Error", "Input")


class Entry(NamedTuple):
    seq: int
    start: float
    runtime: float
    outcome: str
    exitcode: str
    signal: str
    pid: str
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
    def __init__(self, stream: IO[str], *, write_header: bool) -> None:
        self._stream = stream
        if write_header:
            stream.write("\t".join(HEADER) + "\n")
            stream.flush()

    def write(self, entry: Entry) -> None:
        fields = (str(entry.seq), f"{entry.start:.3f}", f"{entry.runtime:.3f}", entry.outcome,
                  entry.exitcode, entry.signal, entry.pid, str(entry.attempts),
                  entry.error or "-", escape(entry.input))
        self._stream.write("\t".join(fields) + "\n")
        self._stream.flush()

    def close(self) -> None:
        self._stream.close()


class Finished(NamedTuple):
    """What a job log says about one input: its last outcome, and the input it was for."""
    ok: bool
    escaped_input: str


def read_joblog(path: str) -> dict[int, Finished]:
    """Seq → its last logged outcome. Raises JoblogError for a file that is not a job log."""
    finished: dict[int, Finished] = {}
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as stream:
            header = stream.readline().rstrip("\n").split("\t")
            if tuple(header) != HEADER:
                raise JoblogError(f"{path} is not a job log of python -m pool map "
                                  f"(its first line is not the header)")
            for number, line in enumerate(stream, start=2):
                fields = line.rstrip("\n").split("\t")
                if len(fields) != len(HEADER) or not fields[0].isdigit():
                    if not line.endswith("\n"):
                        break  # the last line of a run that was killed while writing it
                    raise JoblogError(f"{path}, line {number}: not a job log entry")
                finished[int(fields[0])] = Finished(fields[3] == "ok", fields[-1])
    except OSError as exc:
        raise JoblogError(f"cannot read the job log: {exc}") from exc
    return finished

"""What each finished input of ``python -m pool map`` becomes: its standard-output line, its
job-log entry, its messages on standard error (what it printed, its failure), the counts,
and the progress line.

Runs in: the command's main thread. Knows nothing of the pool: the run hands it inputs
that finished, with how they went.
"""

from __future__ import annotations

from . import output
from .inputs import Input, short
from .joblog import Entry, escape
from .lines import Lines, Messages
from .output import Failure
from .task import Report


class Results:
    def __init__(self, lines: Lines, messages: Messages, *, as_json: bool, tag: bool,
                 progress: output.ProgressLine | None) -> None:
        self.lines = lines
        self.messages = messages
        self.as_json = as_json
        self.tag = tag
        self.progress = progress
        self.ok = self.failed = 0

    def succeeded(self, item: Input, report: Report, attempts: int) -> None:
        self.ok += 1
        entry = Entry(item.seq, report.start, report.runtime, "ok", 0, None, report.pid,
                      attempts, "", item.text)
        if self.as_json:
            line = output.json_result(item.seq, item.value, report.text)
        else:
            line = output.plain_result(report.text)
        self.lines.put(item.seq, output.tagged(item.text, line) if self.tag else line, entry)

    def failed_input(self, item: Input, failure: Failure, attempts: int, start: float,
                     runtime: float) -> None:
        self.failed += 1
        entry = Entry(item.seq, start, runtime, failure.kind, failure.exitcode,
                      failure.signal, failure.pid, attempts, failure.error_type, item.text)
        if failure.kind == "invalid":   # the message quotes the input already
            self.note(f"pool map: input {item.seq}: {failure.message}")
        else:
            self.note(f"pool map: input {item.seq} ({short(item.text)}) failed: "
                      f"{failure.summary}"
                      + ("\n" + failure.detail.rstrip() if failure.detail else ""))
        if self.as_json:
            line = output.json_failure(item.seq, item.value, failure)
        else:
            line = output.plain_failure(failure)
        self.lines.put(item.seq, output.tagged(item.text, line) if self.tag else line, entry)

    def skipped(self, item: Input) -> None:
        """An input ``--resume`` skips: no line, no entry."""
        self.lines.put(item.seq, None)

    def echo(self, item: Input | None, text: str) -> None:
        """What the function printed for ``item``, as one block on standard error."""
        if not text:
            return
        if self.tag and item is not None:
            prefix = escape(item.text) + "\t"
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
        self.note(text.rstrip("\n"))

    def note(self, text: str) -> None:
        """A message on standard error, below the progress bar's line if there is one."""
        if self.progress is not None:
            self.progress.clear()
        self.messages.write(text + "\n")

    def tick(self, running: int, total: int | None) -> None:
        if self.progress is not None:
            self.progress.tick(self.ok, self.failed, running, total)

    def clear_progress(self) -> None:
        if self.progress is not None:
            self.progress.clear()

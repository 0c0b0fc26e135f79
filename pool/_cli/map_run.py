"""The run of ``python -m pool map``: inputs in, jobs to the pool, results out, and how the
run ends. ``Run`` coordinates the parts: the threads that post events (``map_events``),
the jobs in the pool (``map_jobs``), the lines and messages (``results``), and the stop
signals and the end (``map_end``).

Owns: one run: its event queue, its parts, and the order in which they start and end.
Runs in: the command's main thread, and a reader thread that turns the input into
``Input`` records. With ``--progress`` on a file, a third thread counts them. Everything
reaches the main thread as an event on one queue: inputs and their end from the reader,
finished jobs from done-callbacks, signals from the signal handlers. The main thread
alone decides, and alone writes (``results``).

Guarantees:
- Bounded read-ahead (``lines.Window``): memory stays flat however long the input.
- One standard-output line per input that finished (ok or failed), in input order unless
  ``unordered``. An input the run stopped (``--halt now``, a signal, a closed output pipe)
  or never started gets no line and no job-log entry: ``--resume`` runs it again.
- Signals are events: the handlers only count and post them, so no exception lands
  inside the pool's code or ours (DESIGN, contract 9). SIGINT, SIGTERM and SIGHUP end the
  run at the loop's next turn, within ``_CHORES_SECONDS``. A run blocked writing ends at
  once: ``write.write_or_give_up`` asks between slices. While the run ends, one more
  signal gives up on writing what is left. A signal the command inherited as ignored
  (``nohup``, a background job) stays ignored.
- Every way out, a bug of ours included, leaves no worker running: ending early terminates
  the workers and waits until they are reaped (``ProcessPool.terminate_workers``).

Assumes: it is the main thread (signals land here) and the pool's workers ignore SIGINT.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import time
from typing import Callable, Iterator

from . import output
from .. import _shake
from .inputs import Input
from .lines import Lines, Messages, Window
from .map_end import End, RunEnding, RunSummary
from .map_events import Events, InputReader
from .map_jobs import Jobs
from .options import Options
from .results import Results

# How long the run waits for the next event before it writes out the lines it holds.
_BATCH_SECONDS = 0.005
# How often, at most, while events keep coming: flush, progress, check the output pipe.
_CHORES_SECONDS = 0.1


class Run:
    """One run of the command, from the first input to every worker gone."""

    def __init__(self, options: Options, inputs: Iterator[Input],
                 total: int | Callable[[], int | None] | None,
                 stdout_fd: int, stderr_fd: int | None) -> None:
        self.options = options
        self.events: Events = queue.SimpleQueue()
        self.ending = RunEnding(self.events)
        self.window = Window(options.window)
        messages = Messages(stderr_fd, self.ending.give_up)
        progress = (output.ProgressLine(messages, tty=messages.isatty(), interval=3.0)
                    if options.progress and stderr_fd is not None else None)
        self.stdout_is_tty = os.isatty(stdout_fd)
        self.results = Results(
            Lines(stdout_fd, self.window, ordered=not options.unordered,
                  joblog=options.joblog, give_up=self.ending.give_up),
            messages, as_json=options.as_json, tag=options.tag, progress=progress)
        # The total is for the progress line only: counting a long file must not delay
        # the first result, so it is counted beside the run.
        self.total = total if not callable(total) else None
        self.reader = InputReader(self.events, inputs, self.window,
                                  total if callable(total) and progress is not None else None)
        self.jobs = Jobs(options, self.results, self.window, self.events,
                         self.ending.signals)
        self.eof = False
        self.capture_directory = ""                    # where workers keep what inputs print

    def run(self) -> RunSummary:
        self.ending.hold_signals()
        # Made and removed while the signals are ours: a signal cannot leave it behind.
        self.capture_directory = tempfile.mkdtemp(prefix="pool-map-")
        # The run reports each death with its input: the pool's own warning would repeat it.
        pool_logger = logging.getLogger("pool")
        pool_logger.addFilter(_not_a_task_death)
        try:
            end = End.INTERNAL
            try:
                end = self._start_and_loop()
            except BaseException as exc:
                end = self.ending.end_of(exc)
            end = self._wind_up(end)
            if end is End.DONE and self.ending.signals:
                # Every input finished, but a stop signal came before the run was over:
                # the caller (a shell loop, a script) must still learn it was stopped.
                end = End.SIGNAL
            for entry in self.results.lines.dropped:   # finished, but its line was lost
                if entry.outcome == "ok":
                    self.results.ok -= 1
                else:
                    self.results.failed -= 1
            self.ending.report(self.results, end, self._not_finished())
        finally:
            pool_logger.removeFilter(_not_a_task_death)
            shutil.rmtree(self.capture_directory, ignore_errors=True)
            self.ending.release_signals()
        return RunSummary(self.results.ok, self.results.failed, self._not_finished(), end,
                          self.ending.signals[0] if end is End.SIGNAL else 0)

    def _start_and_loop(self) -> End:
        self.jobs.start_pool(self.capture_directory)
        self.reader.start()
        return self._loop()

    def _wind_up(self, end: End) -> End:
        """Ends every worker, then writes the lines of what finished. A signal that comes
        now gives up on the writing; the teardown still finishes, bounded by the pool's
        grace periods."""
        self.ending.winding_up = True
        if _shake.on:
            _shake.pause("cli.before_end_pool")
        self.jobs.end_pool(finished=end is End.DONE)
        if end in (End.OUTPUT_CLOSED, End.OUTPUT_FAILED):
            return end
        lines = self.results.lines
        try:
            if end not in (End.JOBLOG, End.INTERNAL):
                self._drain_finished()
            lines.put_the_rest()
            lines.flush()
        except Exception as exc:   # writing out what finished failed too
            lines.abandon()
            if end is End.INTERNAL:
                return end         # the first error is the one to report
            return self.ending.end_of(exc)
        return end

    def _not_finished(self) -> int:
        jobs = self.jobs
        return jobs.inputs_read - jobs.skipped - self.results.ok - self.results.failed

    def _loop(self) -> End:
        jobs = self.jobs
        chores_due = time.monotonic()
        while True:
            if _shake.on:
                _shake.pause("cli.loop_turn")
            # A signal first: one whose handler ran as the last input finished (the handler
            # runs at the main thread's next bytecode, so after whatever event woke it)
            # still ends the run by that signal, as Python's own Ctrl-C would.
            if self.ending.signals:   # before any event queued ahead of the signal's
                return End.SIGNAL
            if jobs.starting_stopped and not jobs.pending:
                return End.READ_ERROR if self.ending.problem is not None else End.HALT
            if self.eof and jobs.nothing_left():
                return End.DONE
            if time.monotonic() >= chores_due:
                self._chores()
                chores_due = time.monotonic() + _CHORES_SECONDS
            try:
                kind, value = self.events.get(block=False)
            except queue.Empty:
                jobs.hand_batch()
                try:
                    # While results stream in, the next is a moment away: write lines in
                    # batches, not a system call per line.
                    kind, value = self.events.get(timeout=_BATCH_SECONDS)
                except queue.Empty:
                    self._chores()
                    chores_due = time.monotonic() + _CHORES_SECONDS
                    try:
                        kind, value = self.events.get(timeout=_CHORES_SECONDS)
                    except queue.Empty:
                        continue
            if kind == "input":
                jobs.take(value)
            elif kind == "done":
                jobs.finish(value)
            elif kind == "eof":
                self.eof = True
                jobs.hand_batch()
            elif kind == "signal":
                return End.SIGNAL
            elif kind == "total":
                self.total = value
            elif kind == "read_error":
                self._stop_reading_after(value)

    def _chores(self) -> None:
        """Lines out (which also finds a closed output pipe), and the progress line."""
        results = self.results
        jobs = self.jobs
        if results.lines.unwritten and self.stdout_is_tty:
            results.clear_progress()   # both on one terminal: the bar must not split a line
        results.lines.flush()
        total = (self.total if self.total is not None
                 else jobs.inputs_read if self.eof else None)
        # Running: the inputs handed to the pool that its workers can hold. The rest wait
        # in its queue, handed ahead so that no worker waits for the main thread.
        running = min(jobs.in_pool, self.options.workers * self.options.chunksize)
        results.tick(running, None if total is None else total - jobs.skipped)

    def _stop_reading_after(self, error: BaseException) -> None:
        """The input cannot be read on: finish what runs, start nothing more."""
        self.ending.problem = f"pool map: cannot read the input: {error}"
        self.jobs.stop_starting()

    def _drain_finished(self) -> None:
        """After the workers were ended: records what finished before the end came, and
        counts what was read."""
        while True:
            try:
                kind, value = self.events.get(block=False)
            except queue.Empty:
                return
            if kind == "done":
                self.jobs.finish(value)
            elif kind == "input":
                self.jobs.take(value)


def _not_a_task_death(record: logging.LogRecord) -> bool:
    return getattr(record, "pool_event", None) != "worker_died"

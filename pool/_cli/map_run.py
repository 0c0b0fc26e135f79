"""The run of ``python -m pool map``: inputs in, jobs to the pool, results out, and how the
run ends.

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

import collections
import enum
import logging
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any, Callable, Iterator, NamedTuple

from . import output
from .inputs import Input
from .joblog import JoblogError
from .lines import Lines, Messages, OutputClosed, OutputFailed, Window
from .options import Halt, Options
from .results import Results, short
from .task import Report, run_job, setup_worker, take_capture
from .write import WriteAbandoned
from .._errors import WorkerTerminated
from .._executor import ProcessPool

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# How long the run waits for the next event before it writes out the lines it holds.
_BATCH_SECONDS = 0.005
# How often, at most, while events keep coming: flush, progress, check the output pipe.
_CHORES_SECONDS = 0.1

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


class _Job(NamedTuple):
    inputs: list[Input]
    attempt: int
    handed: float          # time.time() when handed to the pool


class Run:
    """One run of the command, from the first input to every worker gone."""

    def __init__(self, options: Options, inputs: Iterator[Input],
                 total: int | Callable[[], int | None] | None,
                 stdout_fd: int, stderr_fd: int | None) -> None:
        self.options = options
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.signals: list[int] = []      # every stop signal received, in order
        self.first_signal_at = 0.0        # time.monotonic() of the first
        self.winding_up = False
        self.window = Window(options.window)
        messages = Messages(stderr_fd, self._give_up)
        progress = (output.ProgressLine(messages, tty=messages.isatty(), interval=3.0)
                    if options.progress and stderr_fd is not None else None)
        self.stdout_is_tty = os.isatty(stdout_fd)
        self.results = Results(
            Lines(stdout_fd, self.window, ordered=not options.unordered,
                  joblog=options.joblog, give_up=self._give_up),
            messages, as_json=options.as_json, tag=options.tag, progress=progress)
        self.reader = threading.Thread(target=self._read, args=(inputs,), daemon=True,
                                       name="pool-map-reader")
        # The total is for the progress line only: counting a long file must not delay
        # the first result, so it is counted beside the run.
        self.total = total if not callable(total) else None
        self.counter = (threading.Thread(target=self._count_total, args=(total,),
                                         daemon=True, name="pool-map-counter")
                        if callable(total) and progress is not None else None)
        self.jobs: dict[Future[Any], _Job] = {}       # handed to the pool, not yet done
        self.in_pool = 0                               # inputs in those jobs
        self.batch: list[Input] = []                   # inputs gathered for the next chunk
        self.ready: collections.deque[list[Input]] = collections.deque()  # chunks to hand
        # The most chunks in the pool at once, running or queued there. 16 per worker
        # keep each worker fed without waiting for the main thread: measured 1.6x the
        # throughput of 4, with one input per chunk. With --halt, no more than can run:
        # a halt then finds nothing queued that would have run after the failure.
        self.max_jobs = options.workers * (1 if options.halt is not None else 16)
        self.inputs_read = self.skipped = 0
        self.eof = False
        self.starting_stopped = False
        self.pool: ProcessPool | None = None
        self.problem: str | None = None                # why the run ended early, for stderr
        self.capture_directory = ""                    # where workers keep what inputs print

    # -- beside the main thread ----------------------------------------------------------

    def _read(self, inputs: Iterator[Input]) -> None:
        try:
            while self.window.take():
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

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only appends and a SimpleQueue put: nothing a signal could split.
        if not self.signals:
            self.first_signal_at = time.monotonic()
        self.signals.append(signum)
        self.events.put(("signal", signum))

    def _give_up(self) -> bool:
        """Whether a blocked write stops waiting. While the run goes on: once a signal
        came, since the loop must answer it. While the run ends: the lines of what
        finished get ``_LAST_WRITES_SECONDS`` after the first signal, or until a second."""
        if not self.signals:
            return False
        if not self.winding_up:
            return True
        return (len(self.signals) > 1
                or time.monotonic() - self.first_signal_at >= _LAST_WRITES_SECONDS)

    # -- the main thread -----------------------------------------------------------------

    def run(self) -> RunSummary:
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum, handler in previous.items():
            if handler is not signal.SIG_IGN:   # nohup's SIGHUP stays ignored
                signal.signal(signum, self._on_signal)
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
                end = self._end_of(exc)
            end = self._wind_up(end)
            for entry in self.results.lines.dropped:   # finished, but its line was lost
                if entry.outcome == "ok":
                    self.results.ok -= 1
                else:
                    self.results.failed -= 1
            self._report_end(end)
        finally:
            pool_logger.removeFilter(_not_a_task_death)
            shutil.rmtree(self.capture_directory, ignore_errors=True)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return RunSummary(self.results.ok, self.results.failed, self._not_finished(), end,
                          self.signals[0] if end is End.SIGNAL else 0)

    def _start_and_loop(self) -> End:
        options = self.options
        self.pool = ProcessPool(options.workers, mp_context=options.mp_context,
                                initializer=setup_worker,
                                initargs=(self.capture_directory,))
        self.reader.start()
        if self.counter is not None:
            self.counter.start()
        return self._loop()

    def _end_of(self, exc: BaseException) -> End:
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

    def _wind_up(self, end: End) -> End:
        """Ends every worker, then writes the lines of what finished. A signal that comes
        now gives up on the writing; the teardown still finishes, bounded by the pool's
        grace periods."""
        self.winding_up = True
        self.starting_stopped = True   # what finishes from now on starts nothing: no retries
        self.window.stopped = True
        if self.pool is not None:
            if end is End.DONE:
                self.pool.shutdown(wait=True)
            else:
                self.pool.terminate_workers(wait=True)
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
            return self._end_of(exc)
        return end

    def _report_end(self, end: End) -> None:
        results = self.results
        if self.problem:
            results.note(self.problem)
        progress = results.progress
        if progress is not None and end is not End.OUTPUT_CLOSED:
            results.note(output.summary_line(results.ok, results.failed, progress.elapsed(),
                                             self._not_finished()))
        if end is End.SIGNAL:
            counts = (f"{results.ok} ok, {results.failed} failed, {self._not_finished()} "
                      f"not finished")
            signum = self.signals[0] if self.signals else signal.SIGINT
            if signum == signal.SIGINT:
                results.note(f"pool map: interrupted ({counts})")
            else:
                results.note(f"pool map: stopped by {signal.Signals(signum).name} ({counts})")

    def _not_finished(self) -> int:
        return self.inputs_read - self.skipped - self.results.ok - self.results.failed

    def _loop(self) -> End:
        chores_due = time.monotonic()
        while True:
            if self.starting_stopped and not self.jobs:
                return End.READ_ERROR if self.problem is not None else End.HALT
            if self.eof and not self.jobs and not self.batch and not self.ready:
                return End.DONE
            if time.monotonic() >= chores_due:
                self._chores()
                chores_due = time.monotonic() + _CHORES_SECONDS
            if self.signals:   # before any event queued ahead of the signal's
                return End.SIGNAL
            try:
                kind, value = self.events.get(block=False)
            except queue.Empty:
                self._hand_batch()
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
                self._take(value)
            elif kind == "done":
                self._finish(value)
            elif kind == "eof":
                self.eof = True
                self._hand_batch()
            elif kind == "signal":
                return End.SIGNAL
            elif kind == "total":
                self.total = value
            elif kind == "read_error":
                self._stop_reading_after(value)

    def _chores(self) -> None:
        """Lines out (which also finds a closed output pipe), and the progress line."""
        results = self.results
        if results.lines.unwritten and self.stdout_is_tty:
            results.clear_progress()   # both on one terminal: the bar must not split a line
        results.lines.flush()
        total = (self.total if self.total is not None
                 else self.inputs_read if self.eof else None)
        # Running: the inputs handed to the pool that its workers can hold. The rest wait
        # in its queue, handed ahead so that no worker waits for the main thread.
        running = min(self.in_pool, self.options.workers * self.options.chunksize)
        results.tick(running, None if total is None else total - self.skipped)

    def _take(self, item: Input) -> None:
        self.inputs_read += 1
        if self.starting_stopped:
            self.window.give_back()
            return
        resume = self.options.resume
        if resume is not None and resume.skips(item.seq, item.text):
            self.skipped += 1
            self.results.skipped(item)
            return
        if item.error is not None:
            failure = output.Failure("invalid", item.error.partition(":")[0], item.error, "")
            self._record_failure(item, failure, attempts=0, start=time.time(), runtime=0.0)
            return
        self.batch.append(item)
        if len(self.batch) >= self.options.chunksize:
            self._hand_batch()

    def _hand_batch(self) -> None:
        """Sends the inputs gathered for a chunk. When the input pauses, a partial chunk
        goes: a slow producer's inputs do not wait for company."""
        if self.batch:
            self.ready.append(self.batch)
            self.batch = []
        self._pump()

    def _pump(self) -> None:
        while self.ready and len(self.jobs) < self.max_jobs and not self.starting_stopped:
            self._hand(self.ready.popleft(), attempt=1)

    def _hand(self, items: list[Input], attempt: int) -> None:
        options = self.options
        assert self.pool is not None
        calls = [(item.args, item.kwargs) for item in items]
        timeout = None if options.timeout is None else options.timeout * len(items)
        future = self.pool.schedule(run_job, (options.function, calls, options.as_json),
                                    timeout=timeout)
        self.jobs[future] = _Job(items, attempt, time.time())
        self.in_pool += len(items)
        future.add_done_callback(_post(self.events))

    def _finish(self, future: Future[Any]) -> None:
        job = self.jobs.pop(future, None)
        if job is None:
            return
        self.in_pool -= len(job.inputs)
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            reports: list[Report] = future.result()
            for item, report in zip(job.inputs, reports):
                self.results.echo(item, report.output)
                if report.ok:
                    self.results.succeeded(item, report, job.attempt)
                else:
                    failure = output.Failure("error", report.error_type, report.text,
                                             report.detail, 1, None, report.pid)
                    self._fail(item, failure, job.attempt, report.start, report.runtime)
        elif isinstance(error, WorkerTerminated) or self.signals:
            # Stopped, not failed: the run ended it, or a stop signal came. A signal to
            # the whole process group also kills the forkserver, and every worker then
            # looks dead.
            pass
        else:
            pid = getattr(error, "pid", None)
            if isinstance(pid, int):   # what the input printed before its worker was lost
                self.results.echo(job.inputs[0] if len(job.inputs) == 1 else None,
                                  take_capture(self.capture_directory, pid))
            failure = output.failure_of(error)
            for item in job.inputs:
                self._fail(item, failure, job.attempt, job.handed, time.time() - job.handed)
        # Only now: a failure above may have halted the run, and then nothing more starts.
        self._pump()

    def _fail(self, item: Input, failure: output.Failure, attempt: int, start: float,
              runtime: float) -> None:
        options = self.options
        if (attempt <= options.retries and failure.kind in options.retry_on
                and not self.starting_stopped):
            self.results.note(f"pool map: input {item.seq} ({short(item.text)}) failed "
                              f"(attempt {attempt} of {options.retries + 1}), retrying: "
                              f"{failure.summary}")
            self._hand([item], attempt + 1)
            return
        self._record_failure(item, failure, attempt, start, runtime)

    def _record_failure(self, item: Input, failure: output.Failure, attempts: int,
                        start: float, runtime: float) -> None:
        results = self.results
        results.failed_input(item, failure, attempts, start, runtime)
        halt = self.options.halt
        if halt is not None and not self.starting_stopped and halt.reached(results.failed,
                                                                  results.ok + results.failed):
            self._halt(halt)

    def _stop_reading_after(self, error: BaseException) -> None:
        """The input cannot be read on: finish what runs, start nothing more."""
        self.problem = f"pool map: cannot read the input: {error}"
        self._stop_starting()

    def _halt(self, halt: Halt) -> None:
        self.results.note(f"pool map: halting ({'now' if halt.now else 'soon'}): "
                          f"{_inputs(self.results.failed)} failed")
        assert self.pool is not None
        if halt.now:
            self.pool.terminate_workers(wait=True)
        self._stop_starting()

    def _stop_starting(self) -> None:
        self.starting_stopped = True
        self.window.stopped = True
        self.batch, self.ready = [], collections.deque()   # never started: not finished
        for future in list(self.jobs):
            future.cancel()   # what has not started; with "soon", the running ones finish

    def _drain_finished(self) -> None:
        """After the workers were ended: records what finished before the end came, and
        counts what was read."""
        while True:
            try:
                kind, value = self.events.get(block=False)
            except queue.Empty:
                return
            if kind == "done":
                self._finish(value)
            elif kind == "input":
                self._take(value)


def _post(events: queue.SimpleQueue[tuple[str, Any]]) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        events.put(("done", future))
    return done


def _not_a_task_death(record: logging.LogRecord) -> bool:
    return getattr(record, "pool_event", None) != "worker_died"


def _inputs(number: int) -> str:
    return f"{number} input" if number == 1 else f"{number} inputs"

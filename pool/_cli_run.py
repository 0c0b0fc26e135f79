"""The run of ``python -m pool map``: inputs in, jobs to the pool, lines out.

Runs in: the command's main thread, plus a reader thread that turns the input into
``Input`` records (and, for ``--progress`` on a file, one that counts them). Everything
that happens reaches the main thread as an event on one queue: inputs and the end of the
input from the reader, finished jobs from done-callbacks, and signals from the signal
handlers. The main thread alone writes output, keeps the counts and decides.

Guarantees:
- Bounded read-ahead (``_cli_lines.Window``): memory stays flat however long the input.
- One standard-output line per input that finished (ok or failed), in input order unless
  ``unordered``. An input the run stopped (``--halt now``, a signal, a closed output pipe)
  or never started gets no line and no job-log entry: ``--resume`` runs it again.
- Signals are events. SIGINT, SIGTERM and SIGHUP end the run at the loop's next turn (within
  ``_CHORES_SECONDS``), so no exception lands inside the pool's code or ours (DESIGN,
  contract 9). A second one raises ``StopRequested`` wherever the main thread is: the way
  out of a write to a pipe nobody reads (the lines not yet written are then lost).
- Every way out, a bug of ours included, leaves no worker running: ending early terminates
  the workers and waits until they are reaped (``ProcessPool.terminate_workers``).

Assumes: it is the main thread (signals land here) and the pool's workers ignore SIGINT.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import queue
import signal
import threading
import time
import traceback
from concurrent.futures import Future
from typing import IO, Any, Callable, Iterator, NamedTuple

from . import _cli_output as output
from ._cli_inputs import Input
from ._cli_joblog import Entry, Joblog, JoblogError, Resume, escape
from ._cli_lines import Lines, OutputClosed, OutputFailed, Window
from ._cli_task import Report, run_job, setup_worker, take_capture
from ._errors import WorkerTerminated
from ._executor import ProcessPool

RETRY_KINDS = ("died", "timeout", "error")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# How long the run waits for the next event before it writes out the lines it holds.
_BATCH_SECONDS = 0.005
# How often, at most, while events keep coming: flush, progress, check the output pipe.
_CHORES_SECONDS = 0.1

# ``--halt ...,fail=P%`` is judged once this many inputs have finished (fewer prove nothing).
HALT_MIN_FINISHED = 10


class Halt(NamedTuple):
    """``--halt now|soon,fail=N|P%``."""
    now: bool
    failures: int | None
    percent: float | None

    def reached(self, failed: int, finished: int) -> bool:
        if self.failures is not None:
            return failed >= self.failures
        assert self.percent is not None
        return finished >= HALT_MIN_FINISHED and failed * 100 >= self.percent * finished


@dataclasses.dataclass
class Options:
    function: Callable[..., Any]
    workers: int
    chunksize: int
    mp_context: Any
    as_json: bool
    tag: bool
    unordered: bool
    progress: bool
    timeout: float | None
    retries: int
    retry_on: frozenset[str]
    halt: Halt | None
    joblog: Joblog | None
    resume: Resume | None                   # --resume, --resume-failed
    window: int
    capture_directory: str                  # where workers keep what an input prints


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


class Outcome(NamedTuple):
    ok: int
    failed: int
    not_finished: int     # inputs read (ahead, queued or running) that got no outcome
    end: End
    signum: int = 0


class StopRequested(BaseException):
    """A second stop signal arrived while the run was still ending the first way."""


class _Job(NamedTuple):
    inputs: list[Input]
    attempt: int
    handed: float          # time.time() when handed to the pool


class Run:
    def __init__(self, options: Options, inputs: Iterator[Input],
                 total: int | Callable[[], int | None] | None,
                 stdout: IO[bytes], stderr: IO[str] | None) -> None:
        self.options = options
        self.stderr = stderr
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.window = Window(options.window)
        self.lines = Lines(stdout, self.window, ordered=not options.unordered)
        self.stdout_is_tty = _isatty(stdout)
        self.reader = threading.Thread(target=self._read, args=(inputs,), daemon=True,
                                       name="pool-map-reader")
        # The total is for the progress line only: counting a long file must not delay
        # the first result, so it is counted beside the run.
        self.total = total if not callable(total) else None
        self.counter = (threading.Thread(target=self._count, args=(total,), daemon=True,
                                         name="pool-map-counter")
                        if callable(total) and options.progress else None)
        self.jobs: dict[Future[Any], _Job] = {}       # handed to the pool, not yet done
        self.in_pool = 0                               # inputs in those jobs
        self.batch: list[Input] = []                   # inputs gathered for the next chunk
        self.ready: collections.deque[list[Input]] = collections.deque()  # chunks to hand
        # Chunks handed to the pool at most, running or queued there: enough that a worker
        # never waits for the main thread to hand it more (16 per worker measured 1.6x
        # the throughput of 4 with one input per chunk); with --halt, no more than can
        # run, so a halt finds nothing queued that would have run after the failure.
        self.in_flight = options.workers * (1 if options.halt is not None else 16)
        self.read = self.ok = self.failed = self.skipped = 0
        self.eof = False
        self.halting = False
        self.signum = 0
        self.forced = False                            # a second signal: end, write nothing
        self.progress = (output.Progress(stderr, tty=_isatty(stderr), interval=3.0)
                         if options.progress and stderr is not None else None)
        self.pool: ProcessPool | None = None
        self.problem: str | None = None                # why the run ended early, for stderr

    # -- threads beside the main one ------------------------------------------------------

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

    def _count(self, count: Callable[[], int | None]) -> None:
        try:
            self.events.put(("total", count()))
        except Exception:
            pass  # (the progress line goes without a total)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum:
            raise StopRequested
        self.signum = signum
        self.events.put(("signal", signum))

    # -- the main thread -----------------------------------------------------------------

    def run(self) -> Outcome:
        options = self.options
        previous = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}
        end = End.INTERNAL
        try:
            self.pool = ProcessPool(options.workers, mp_context=options.mp_context,
                                    initializer=setup_worker,
                                    initargs=(options.capture_directory,))
            self.reader.start()
            if self.counter is not None:
                self.counter.start()
            end = self._loop()
        except (StopRequested, KeyboardInterrupt):
            end = End.SIGNAL
            self.signum = self.signum or signal.SIGINT
            self.forced = True
        except BaseException as exc:
            end = self._end_of(exc)
        finally:
            # From here on the run only ends: more signals must not interrupt the teardown
            # (it is bounded by the pool's grace periods).
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
            try:
                end = self._wind_up(end)
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
        not_finished = self.read - self.skipped - self.ok - self.failed
        if self.problem:
            self._note(self.problem)
        if self.progress is not None and end is not End.OUTPUT_CLOSED:
            self._note(output.summary_line(self.ok, self.failed, self.progress.elapsed(),
                                           not_finished))
        return Outcome(self.ok, self.failed, not_finished, end,
                       self.signum if end is End.SIGNAL else 0)

    def _end_of(self, exc: BaseException) -> End:
        """The End an exception means (and the message that says so)."""
        if isinstance(exc, OutputClosed):
            return End.OUTPUT_CLOSED
        if isinstance(exc, OutputFailed):
            self.problem = f"pool map: cannot write standard output: {exc}; stopped"
            return End.OUTPUT_FAILED
        if isinstance(exc, JoblogError):
            self.problem = f"pool map: {exc}; stopped"
            return End.JOBLOG
        if not isinstance(exc, Exception):
            raise exc   # (SystemExit and the like: not ours to explain)
        self.problem = ("pool map: internal error (a bug in pool; please report it); the "
                        "workers were stopped:\n" + "".join(traceback.format_exception(exc))
                        ).rstrip()
        return End.INTERNAL

    def _wind_up(self, end: End) -> End:
        """Every worker ended, then the lines of what finished written."""
        self.halting = True   # what finishes from now on starts nothing: no retries
        self.window.stopped = True
        if self.pool is not None:
            if end is End.DONE:
                self.pool.shutdown(wait=True)
            else:
                self.pool.terminate_workers(wait=True)
        if self.forced:   # (writing may be what blocked: the lines not written are lost)
            self.lines.abandon()
        elif end not in (End.OUTPUT_CLOSED, End.OUTPUT_FAILED):
            try:
                if end is not End.JOBLOG:
                    self._drain_finished()
                self.lines.put_the_rest()
                self._flush()
            except BaseException as exc:   # (writing out what finished failed in its turn)
                if end is End.INTERNAL or not isinstance(exc, Exception):
                    raise
                end = self._end_of(exc)
        if end in (End.OUTPUT_CLOSED, End.OUTPUT_FAILED):
            self.lines.abandon()
        return end

    def _loop(self) -> End:
        chores_due = time.monotonic()
        while True:
            if self.halting and not self.jobs:
                return End.READ_ERROR if self.problem is not None else End.HALT
            if self.eof and not self.jobs and not self.batch and not self.ready:
                return End.DONE
            if time.monotonic() >= chores_due:
                self._chores()
                chores_due = time.monotonic() + _CHORES_SECONDS
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
        if self.lines.unwritten and self.progress is not None and self.stdout_is_tty:
            self.progress.clear()   # both on one terminal: the bar must not split a line
        self._flush()
        self._tick()

    def _flush(self) -> None:
        self.lines.flush()

    def _take(self, item: Input) -> None:
        self.read += 1
        if self.halting:
            self.window.give_back()
            return
        resume = self.options.resume
        if resume is not None and resume.skips(item.seq, item.text):
            self.skipped += 1
            self.lines.put(item.seq, None)
            return
        if item.error is not None:
            failure = output.Failure("invalid", item.error.partition(":")[0], item.error, "")
            self._record_failure(item, failure, attempts=0, start=time.time(), runtime=0.0)
            return
        self.batch.append(item)
        if len(self.batch) >= self.options.chunksize:
            self._hand_batch()

    def _hand_batch(self) -> None:
        """Send the inputs gathered for a chunk (a partial one when the input pauses, so
        that a slow producer's inputs do not wait for company)."""
        if self.batch:
            self.ready.append(self.batch)
            self.batch = []
        self._pump()

    def _pump(self) -> None:
        while self.ready and len(self.jobs) < self.in_flight and not self.halting:
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
                self._echo(item, report.output)
                if report.ok:
                    self._record_ok(item, report, job.attempt)
                else:
                    failure = output.Failure("error", report.error_type, report.text,
                                             report.detail, 1, None, report.pid)
                    self._fail(item, failure, job.attempt, report.start, report.runtime)
        elif not isinstance(error, WorkerTerminated):   # (if so, the run ended it)
            pid = getattr(error, "pid", None)
            if isinstance(pid, int):   # what the input printed before its worker was lost
                self._echo(job.inputs[0] if len(job.inputs) == 1 else None,
                           take_capture(self.options.capture_directory, pid))
            failure = output.failure_of(error)
            for item in job.inputs:
                self._fail(item, failure, job.attempt, job.handed, time.time() - job.handed)
        # Only now: a failure above may have halted the run, and then nothing more starts.
        self._pump()

    def _fail(self, item: Input, failure: output.Failure, attempt: int, start: float,
              runtime: float) -> None:
        options = self.options
        if (attempt <= options.retries and failure.kind in options.retry_on
                and not self.halting):
            self._note(f"pool map: input {item.seq} ({_short(item.text)}) failed "
                       f"(attempt {attempt} of {options.retries + 1}), retrying: "
                       f"{failure.summary}")
            self._hand([item], attempt + 1)
            return
        self._record_failure(item, failure, attempt, start, runtime)

    def _record_ok(self, item: Input, report: Report, attempt: int) -> None:
        self.ok += 1
        self._log(Entry(item.seq, report.start, report.runtime, "ok", 0, None, report.pid,
                        attempt, "", item.text))
        options = self.options
        if options.as_json:
            line = output.json_result(item.seq, item.value, report.text)
        else:
            line = output.plain_result(report.text)
        self.lines.put(item.seq, output.tagged(item.text, line) if options.tag else line)

    def _record_failure(self, item: Input, failure: output.Failure, attempts: int,
                        start: float, runtime: float) -> None:
        self.failed += 1
        self._log(Entry(item.seq, start, runtime, failure.kind, failure.exitcode,
                        failure.signal, failure.pid, attempts, failure.error_type, item.text))
        report = f"pool map: input {item.seq} ({_short(item.text)}) failed: {failure.summary}"
        self._note(report + ("\n" + failure.detail.rstrip() if failure.detail else ""))
        options = self.options
        if options.as_json:
            line = output.json_failure(item.seq, item.value, failure)
        else:
            line = output.plain_failure(failure)
        self.lines.put(item.seq, output.tagged(item.text, line) if options.tag else line)
        halt = options.halt
        if halt is not None and not self.halting and halt.reached(self.failed,
                                                                  self.ok + self.failed):
            self._halt(halt)

    def _stop_reading_after(self, error: BaseException) -> None:
        """The input cannot be read on: finish what runs, start nothing more."""
        self.problem = f"pool map: cannot read the input: {error}"
        self._stop_starting()

    def _halt(self, halt: Halt) -> None:
        self._note(f"pool map: halting ({'now' if halt.now else 'soon'}): "
                   f"{_inputs(self.failed)} failed")
        assert self.pool is not None
        if halt.now:
            self.pool.terminate_workers(wait=True)
        self._stop_starting()

    def _stop_starting(self) -> None:
        self.halting = True
        self.window.stopped = True
        self.batch, self.ready = [], collections.deque()   # never started: not finished
        for future in list(self.jobs):
            future.cancel()   # what has not started (with soon, the running ones finish)

    def _log(self, entry: Entry) -> None:
        if self.options.joblog is not None:
            self.options.joblog.write(entry)

    def _echo(self, item: Input | None, text: str) -> None:
        """What the function printed, as one block on standard error."""
        if not text:
            return
        if self.options.tag and item is not None:
            prefix = escape(item.text) + "\t"
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
        self._note(text.rstrip("\n"))

    def _drain_finished(self) -> None:
        """After the workers were ended: record what finished before the end came."""
        while True:
            try:
                kind, value = self.events.get(block=False)
            except queue.Empty:
                return
            if kind == "done":
                self._finish(value)

    def _tick(self) -> None:
        if self.progress is None:
            return
        total = self.total if self.total is not None else (self.read if self.eof else None)
        if total is not None:
            total -= self.skipped
        try:
            self.progress.tick(self.ok, self.failed, self.in_pool, total)
        except Exception:   # standard error is gone: so is the progress line
            self.progress = None

    def _note(self, text: str) -> None:
        """A message on standard error (never fatal: a closed stderr loses only messages)."""
        try:
            if self.progress is not None:
                self.progress.clear()
            if self.stderr is not None:
                self.stderr.write(text + "\n")
                self.stderr.flush()
        except Exception:
            pass


def _post(events: queue.SimpleQueue[tuple[str, Any]]) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        events.put(("done", future))
    return done


def _inputs(number: int) -> str:
    return f"{number} input" if number == 1 else f"{number} inputs"


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def _isatty(stream: IO[Any] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False

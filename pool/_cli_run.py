"""The run of ``python -m pool map``: inputs in, jobs to the pool, lines out.

Runs in: the command's main thread, plus one reader thread that turns the input into
``Input`` records and hands them over through ``events`` (so the main thread never blocks
on the input while results are ready to print). Done-callbacks post finished jobs to the
same queue; the main thread alone writes output, keeps the counts and decides.

Guarantees:
- Bounded read-ahead: the reader takes a slot of ``window`` before each input and the main
  thread gives it back when that input's line is written, so memory stays flat however
  long the input is, and a slow input holds back at most ``window`` others.
- One standard-output line per input that finished (ok or failed), in input order unless
  ``unordered``. An input the run stopped (``--halt now``, Ctrl-C, SIGTERM, a closed output
  pipe) or never started gets no line and no job-log entry: ``--resume`` runs it again.
- Every way out leaves no worker running: ending early terminates the workers and waits
  until they are reaped (``ProcessPool.terminate_workers``).

Assumes: it is the main thread (signals land here) and the pool's workers ignore SIGINT.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import select
import signal
import stat
import threading
import time
from concurrent.futures import Future
from typing import IO, Any, Callable, Iterator, NamedTuple

from . import _cli_output as output
from ._cli_inputs import Input
from ._cli_joblog import Entry, Finished, Joblog, escape
from ._cli_task import Report, run_job, setup_worker, summary
from ._errors import TaskTimeout, WorkerDied, WorkerTerminated, describe_exit
from ._executor import ProcessPool

RETRY_KINDS = ("died", "timeout", "error")

# How long the run waits for the next event before it writes out the lines it holds.
_BATCH_SECONDS = 0.005
# How often, at most, while events keep coming: flush, progress, check the output pipe.
# (Also the longest wait for an event: a Ctrl-C between two is seen within it.)
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
    resume: dict[int, Finished] | None      # what a job log says finished, with --resume*
    resume_failed: bool
    window: int


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: end the run as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Outcome(NamedTuple):
    ok: int
    failed: int
    not_run: int          # inputs read but stopped or never started
    ended_by: str         # "end", "halt", "pipe", "interrupt", "signal", "joblog"
    signum: int = 0


class _Job(NamedTuple):
    inputs: list[Input]
    attempt: int
    handed: float          # time.time() when handed to the pool


class Run:
    def __init__(self, options: Options, inputs: Iterator[Input], total: int | None,
                 stdout: IO[bytes], stderr: IO[str]) -> None:
        self.options = options
        self.total = total
        self.stdout, self.stderr = stdout, stderr
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # The window's free slots, as tokens. Not a threading.Semaphore, nor an Event for
        # the stop: their Python-level Condition can be left locked for good by a Ctrl-C
        # that lands inside it (DESIGN, contract 9); a SimpleQueue's put is one C call.
        self.window: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(options.window):
            self.window.put(None)
        self.reading_stopped = False
        self.reader = threading.Thread(target=self._read, args=(inputs,), daemon=True,
                                       name="pool-map-reader")
        self.jobs: dict[Future[Any], _Job] = {}       # handed to the pool, not yet done
        self.batch: list[Input] = []                   # inputs gathered for the next chunk
        self.ready: collections.deque[list[Input]] = collections.deque()  # chunks to hand
        # Chunks handed to the pool at most, running or queued there: enough to keep every
        # worker busy, few enough that a halt or a stop finds little already started.
        self.in_flight = 4 * options.workers
        self.read = self.ok = self.failed = self.skipped = 0
        self.eof = False
        self.halting = False
        self.next_seq = 1                              # the next line due, when ordered
        self.due: dict[int, str | None] = {}           # finished lines waiting for their turn
        self.progress = (output.Progress(stderr, tty=_isatty(stderr), interval=3.0)
                         if options.progress else None)
        self.pipe_watch = _pipe_watch(stdout)
        self.pool: ProcessPool | None = None
        self.joblog_error: str | None = None
        self.read_error: str | None = None

    # -- the reader thread ---------------------------------------------------------------

    def _read(self, inputs: Iterator[Input]) -> None:
        try:
            while True:
                while not self._take_slot():
                    if self.reading_stopped:
                        return
                if self.reading_stopped:
                    return
                item = next(inputs, None)
                if item is None:
                    self.events.put(("eof", None))
                    return
                self.events.put(("input", item))
        except BaseException as exc:  # an unreadable input ends the run, with the reason
            self.events.put(("read_error", exc))

    def _take_slot(self) -> bool:
        try:
            self.window.get(timeout=0.25)
        except queue.Empty:
            return False
        return True

    # -- the main thread -----------------------------------------------------------------

    def run(self) -> Outcome:
        options = self.options
        self.pool = ProcessPool(options.workers, mp_context=options.mp_context,
                                initializer=setup_worker)
        ended_by, signum = "crash", 0   # (an exception of our own: end the workers too)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                                     signal.SIGHUP)}
        try:
            self.reader.start()
            ended_by = self._loop()
        except KeyboardInterrupt:
            ended_by = "interrupt"
        except Stopped as stop:
            ended_by, signum = "signal", stop.signum
        except BrokenPipeError:
            ended_by = "pipe"
        finally:
            # From here on the run only ends: a second Ctrl-C must not interrupt the
            # teardown (it is bounded by the pool's grace periods).
            for signum_ in handlers:
                signal.signal(signum_, signal.SIG_IGN)
            self.halting = True   # what finishes from now on starts nothing: no refills
            self.reading_stopped = True
            if ended_by == "end":
                self.pool.shutdown(wait=True)
            else:
                self.pool.terminate_workers(wait=True)
                if ended_by not in ("pipe", "crash"):
                    self._drain_finished()
            for signum_, handler in handlers.items():
                signal.signal(signum_, handler)
        if ended_by != "pipe":
            self._flush_due()
        not_run = self.read - self.skipped - self.ok - self.failed
        if self.progress is not None and ended_by != "pipe":
            self.progress.clear()
            self._note(output.summary_line(self.ok, self.failed, self.progress.elapsed(),
                                           not_run))
        if self.joblog_error:
            self._note(self.joblog_error)
            ended_by = "joblog"
        return Outcome(self.ok, self.failed, not_run, ended_by, signum)

    def _loop(self) -> str:
        chores_due = time.monotonic()
        while True:
            if self.halting and not self.jobs:
                return "read_error" if self.read_error is not None else "halt"
            if self.eof and not self.jobs and not self.batch and not self.ready:
                return "end"
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
            elif kind == "read_error":
                self._stop_reading_after(value)
            if self.joblog_error:
                return "joblog"

    def _chores(self) -> None:
        """Lines out, the progress line, and whether the reader of our output has gone."""
        self._flush_stdout()
        self._tick()
        if self.pipe_watch is not None and self.pipe_watch():
            raise BrokenPipeError

    def _take(self, item: Input) -> None:
        self.read += 1
        if self.halting:
            self.window.put(None)
            return
        finished = self.options.resume.get(item.seq) if self.options.resume is not None else None
        if finished is not None:
            if finished.escaped_input != escape(item.text):
                self.joblog_error = (
                    f"pool map: the job log was written for other inputs: input {item.seq} "
                    f"is {escape(item.text)!r} here, {finished.escaped_input!r} in the log; "
                    f"nothing more was run")
                self.skipped += 1
                self.due[item.seq] = None
                return
            if finished.ok or not self.options.resume_failed:
                self.skipped += 1
                self._emit(item.seq, None)
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
        future.add_done_callback(_post(self.events))

    def _finish(self, future: Future[Any]) -> None:
        job = self.jobs.pop(future, None)
        if job is None or future.cancelled():
            return
        self._pump()
        error = future.exception()
        if error is None:
            reports: list[Report] = future.result()
            for item, report in zip(job.inputs, reports):
                self._echo(item, report.output)
                if report.ok:
                    self._record_ok(item, report, job.attempt)
                else:
                    failure = output.Failure("error", report.error_type, report.text,
                                             report.detail, "1", "-", str(report.pid))
                    self._fail(item, failure, job.attempt, report.start, report.runtime)
            return
        if isinstance(error, WorkerTerminated):
            return  # the run ended it: it did not finish
        failure = _failure_of(error)
        for item in job.inputs:
            self._fail(item, failure, job.attempt, job.handed, time.time() - job.handed)

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
        self._log(Entry(item.seq, report.start, report.runtime, "ok", "0", "-",
                        str(report.pid), attempt, "", item.text))
        options = self.options
        if options.as_json:
            line = output.json_result(item.seq, item.value, report.text)
        else:
            line = output.plain_result(report.text)
        self._emit(item.seq, output.tagged(item.text, line) if options.tag else line)

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
        self._emit(item.seq, output.tagged(item.text, line) if options.tag else line)
        halt = options.halt
        if halt is not None and not self.halting and halt.reached(self.failed,
                                                                  self.ok + self.failed):
            self._halt(halt)

    def _stop_reading_after(self, error: BaseException) -> None:
        """The input cannot be read on: finish what runs, start nothing more."""
        self.read_error = f"pool map: cannot read the input: {error}"
        self._note(self.read_error)
        self.halting = True
        self.batch, self.ready = [], collections.deque()
        for future in list(self.jobs):
            future.cancel()

    def _halt(self, halt: Halt) -> None:
        self.halting = True
        self.reading_stopped = True
        self.batch, self.ready = [], collections.deque()   # never started: not run
        self._note(f"pool map: halting ({'now' if halt.now else 'soon'}): "
                   f"{_inputs(self.failed)} failed")
        assert self.pool is not None
        if halt.now:
            self.pool.terminate_workers(wait=True)
        for future in list(self.jobs):
            future.cancel()   # what has not started (the running ones finish, with soon)

    def _log(self, entry: Entry) -> None:
        if self.options.joblog is not None:
            self.options.joblog.write(entry)

    def _echo(self, item: Input, text: str) -> None:
        """What the function printed, as one block on standard error."""
        if not text:
            return
        if self.options.tag:
            prefix = escape(item.text) + "\t"
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
        self._note(text.rstrip("\n"))

    def _emit(self, seq: int, line: str | None) -> None:
        if self.options.unordered:
            self._write(line)
            return
        self.due[seq] = line
        while self.next_seq in self.due:
            self._write(self.due.pop(self.next_seq))
            self.next_seq += 1

    def _flush_due(self) -> None:
        """At an early end: the lines of what finished, in order, past the gaps."""
        for seq in sorted(self.due):
            self._write(self.due.pop(seq))
        try:
            self._flush_stdout()
        except BrokenPipeError:
            pass

    def _write(self, line: str | None) -> None:
        self.window.put(None)
        if line is not None:
            self.stdout.write((line + "\n").encode("utf-8", "surrogateescape"))

    def _flush_stdout(self) -> None:
        self.stdout.flush()

    def _drain_finished(self) -> None:
        """After the workers were ended: record what finished before the end came."""
        while True:
            try:
                kind, value = self.events.get(block=False)
            except queue.Empty:
                return
            if kind == "done":
                try:
                    self._finish(value)
                except BrokenPipeError:
                    return

    def _tick(self) -> None:
        if self.progress is not None:
            total = self.total if self.total is not None else (self.read if self.eof else None)
            if total is not None:
                total -= self.skipped
            self.progress.tick(self.ok, self.failed, len(self.jobs), total)

    def _note(self, text: str) -> None:
        """A message on standard error (never fatal: a closed stderr loses only messages)."""
        try:
            if self.progress is not None:
                self.progress.clear()
            self.stderr.write(text + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass


def _post(events: queue.SimpleQueue[tuple[str, Any]]) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        events.put(("done", future))
    return done


def _failure_of(error: BaseException) -> output.Failure:
    """A pool-level failure (the whole job failed) in the output's terms."""
    if isinstance(error, WorkerDied):
        signame = error.signal_name or "-"
        code = "-" if error.exitcode is None else str(max(error.exitcode, 0))
        return output.Failure("died", "WorkerDied",
                              f"WorkerDied: worker pid {error.pid} died "
                              f"({describe_exit(error.exitcode)})",
                              error.crash_report or "", code, signame, str(error.pid))
    if isinstance(error, TaskTimeout):
        where = ("Where it was when the time ran out:\n" + error.stack.rstrip()
                 if error.stack else "(the worker did not write its stack in time)")
        return output.Failure("timeout", "TaskTimeout",
                              f"TaskTimeout: ran longer than {error.timeout:g} s "
                              f"(worker pid {error.pid} killed)",
                              where, "-", "SIGKILL", str(error.pid))
    return output.Failure("error", type(error).__name__, summary(error), str(error), "-")


def _inputs(number: int) -> str:
    return f"{number} input" if number == 1 else f"{number} inputs"


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


def _pipe_watch(stdout: IO[bytes]) -> Callable[[], bool] | None:
    """On Linux, the write end of a pipe whose reader is gone polls as an error: the run
    then ends at once, not at its next line (``| head`` while long tasks run)."""
    try:
        fd = stdout.fileno()
        if not hasattr(select, "poll") or not stat_is_fifo(fd):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    poller = select.poll()
    poller.register(fd, select.POLLERR)

    def closed() -> bool:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    return closed


def stat_is_fifo(fd: int) -> bool:
    return stat.S_ISFIFO(os.fstat(fd).st_mode)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end the run as Ctrl-C does (workers stopped, status 128+N)."""
    def stop(signum: int, frame: Any) -> None:
        raise Stopped(signum)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)

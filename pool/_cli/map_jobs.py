"""The jobs of a ``python -m pool map`` run: its inputs handed to the pool in chunks, and
what comes back, with retries and ``--halt``.

Owns: the pool and the jobs in it, the inputs gathered for the next chunk and the chunks
waiting to go, the counts of inputs read and skipped, and whether the run still starts
anything (``starting_stopped``).
Runs in: the command's main thread only. A job's done-callback runs elsewhere and only
posts the future (``map_events.post_done``); the main thread hands it to ``finish``.
Guarantees:
- A chunk goes while fewer than ``max_jobs`` jobs are in the pool; a retry goes at once.
  A partial chunk goes as soon as the input pauses (``hand_batch``).
- Every input that finished goes to ``Results`` once: ok, failed, or failed after its
  retries. An input the run stopped (``--halt now``, a signal, the end of the run) or never
  started goes nowhere: ``--resume`` runs it again.
- Once starting is stopped, nothing more starts: no chunk, no retry.
Assumes: the main thread hands it every input read (``take``) and every job done
(``finish``), and ends the pool with ``end_pool``.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future
from typing import Any, NamedTuple

from . import output
from .inputs import Input, short
from .lines import Window
from .map_events import Events, post_done
from .options import Halt, Options
from .results import Results
from .task import Report, run_job, setup_worker, take_capture
from .._errors import WorkerTerminated
from .._executor import ProcessPool


class _Job(NamedTuple):
    inputs: list[Input]
    attempt: int
    handed_at: float       # time.time() when handed to the pool


class Jobs:
    """The inputs of one run on their way through the pool."""

    def __init__(self, options: Options, results: Results, window: Window, events: Events,
                 stop_signals: list[int]) -> None:
        self.options = options
        self.results = results
        self.window = window
        self.events = events
        # The run's stop signals so far: a job that fails once one came was stopped.
        self.stop_signals = stop_signals
        self.pool: ProcessPool | None = None
        self.capture_directory = ""                    # where workers keep what inputs print
        self.pending: dict[Future[Any], _Job] = {}     # handed to the pool, not yet done
        self.in_pool = 0                               # inputs in those jobs
        self.batch: list[Input] = []                   # inputs gathered for the next chunk
        self.ready: collections.deque[list[Input]] = collections.deque()  # chunks to hand
        # The most chunks in the pool at once, running or queued there. 16 per worker
        # keep each worker fed without waiting for the main thread: measured 1.6x the
        # throughput of 4, with one input per chunk. With --halt, no more than can run:
        # a halt then finds nothing queued that would have run after the failure.
        self.max_jobs = options.workers * (1 if options.halt is not None else 16)
        self.inputs_read = self.skipped = 0
        self.starting_stopped = False

    def start_pool(self, capture_directory: str) -> None:
        options = self.options
        self.capture_directory = capture_directory
        self.pool = ProcessPool(options.workers, mp_context=options.mp_context,
                                initializer=setup_worker,
                                initargs=(self.capture_directory,))

    def end_pool(self, finished: bool) -> None:
        """Ends every worker: a run that ``finished`` shuts the pool down, any other
        terminates the workers. Both wait until the workers are reaped."""
        self.starting_stopped = True   # what finishes from now on starts nothing: no retries
        self.window.stopped = True
        if self.pool is not None:
            if finished:
                self.pool.shutdown(wait=True)
            else:
                self.pool.terminate_workers(wait=True)

    def nothing_left(self) -> bool:
        """No job in the pool, no chunk waiting, no input gathered."""
        return not self.pending and not self.batch and not self.ready

    def take(self, item: Input) -> None:
        """An input the reader read: skipped, failed at once, or gathered for a chunk."""
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
            failure = output.Failure("invalid", item.error.error_type, item.error.message, "")
            self._record_failure(item, failure, attempts=0, start=time.time(), runtime=0.0)
            return
        self.batch.append(item)
        if len(self.batch) >= self.options.chunksize:
            self.hand_batch()

    def hand_batch(self) -> None:
        """Sends the inputs gathered for a chunk. When the input pauses, a partial chunk
        goes: a slow producer's inputs do not wait for company."""
        if self.batch:
            self.ready.append(self.batch)
            self.batch = []
        self._pump()

    def _pump(self) -> None:
        while self.ready and len(self.pending) < self.max_jobs and not self.starting_stopped:
            self._hand(self.ready.popleft(), attempt=1)

    def _hand(self, items: list[Input], attempt: int) -> None:
        options = self.options
        assert self.pool is not None
        calls = [(item.args, item.kwargs) for item in items]
        timeout = None if options.timeout is None else options.timeout * len(items)
        future = self.pool.schedule(run_job, (options.function, calls, options.as_json),
                                    timeout=timeout)
        self.pending[future] = _Job(items, attempt, time.time())
        self.in_pool += len(items)
        future.add_done_callback(post_done(self.events))

    def finish(self, future: Future[Any]) -> None:
        """A job the pool is done with: its inputs' outcomes go to the results."""
        job = self.pending.pop(future, None)
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
        elif isinstance(error, WorkerTerminated) or self.stop_signals:
            # Stopped, not failed: the run ended it, or a stop signal came, and the
            # workers may have had it too (a SIGKILL of the group, a worker that was
            # still starting).
            pass
        else:
            pid = getattr(error, "pid", None)
            if isinstance(pid, int):   # what the input printed before its worker was lost
                self.results.echo(job.inputs[0] if len(job.inputs) == 1 else None,
                                  take_capture(self.capture_directory, pid))
            failure = output.failure_of(error)
            ran_for = time.time() - job.handed_at
            for item in job.inputs:
                self._fail(item, failure, job.attempt, job.handed_at, ran_for)
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

    def _halt(self, halt: Halt) -> None:
        self.results.note(f"pool map: halting ({'now' if halt.now else 'soon'}): "
                          f"{_inputs(self.results.failed)} failed")
        assert self.pool is not None
        if halt.now:
            self.pool.terminate_workers(wait=True)
        self.stop_starting()

    def stop_starting(self) -> None:
        """Starts nothing more: drops what waits to go, cancels what the pool has not
        started."""
        self.starting_stopped = True
        self.window.stopped = True
        self.batch, self.ready = [], collections.deque()   # never started: not finished
        for future in list(self.pending):
            future.cancel()   # what has not started; with "soon", the running ones finish


def _inputs(number: int) -> str:
    return f"{number} input" if number == 1 else f"{number} inputs"

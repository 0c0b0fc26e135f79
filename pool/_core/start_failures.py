"""Workers that fail to start, and starts the system refuses.

Owns: the count of failed starts in a row, the count of refused rounds of starts in a
row, and when a start may be tried again after a refusal.
Runs in: the dispatcher thread, inside ``StateMachine``.
Guarantees:
- a worker that dies before READY is a failed start; ``MAX_START_FAILURES`` in a row, with
  no task completed in between, mean the initializer or the worker's start-up is broken:
  the machine breaks the pool rather than start workers in a loop;
- a start the system refuses for want of a resource says nothing about the workers and
  never breaks the pool: no start is tried before a delay that doubles with each round of
  refused starts in a row, from ``START_RETRY_FIRST_SECONDS`` up to
  ``START_RETRY_MAX_SECONDS``. After a refusal, one start is tried at a time, a probe, until
  a worker is READY: a hundred empty slots need not each be refused at every try. Once
  ``MAX_REFUSED_STARTS`` rounds were refused, about 1.3 s, what is queued may fail
  ``REFUSED`` if no worker is left to run it; tasks submitted later wait for the next try.
Assumes: the times it is given come from the machine's clock.
"""

from __future__ import annotations

from .backoff import doubling

MAX_START_FAILURES = 3

START_RETRY_FIRST_SECONDS = 0.01
START_RETRY_MAX_SECONDS = 2.0
MAX_REFUSED_STARTS = 8


class StartFailures:
    __slots__ = ("failures", "refused", "retry_at")

    def __init__(self) -> None:
        self.failures = 0   # workers that died before READY, in a row
        self.refused = 0    # rounds of starts refused, in a row
        self.retry_at: float | None = None  # no start before then, after a refusal

    @property
    def too_many_failures(self) -> bool:
        """Workers keep failing to start: the pool is to break."""
        return self.failures >= MAX_START_FAILURES

    @property
    def probing(self) -> bool:
        """Starts were refused lately: one start at a time, until a worker is READY."""
        return self.refused > 0

    @property
    def too_many_refused(self) -> bool:
        """Starts were refused so long that queued tasks may fail rather than wait."""
        return self.refused >= MAX_REFUSED_STARTS

    def start_failed(self) -> None:
        self.failures += 1

    def task_completed(self) -> None:
        """The starts that failed before a completed task do not count."""
        self.failures = 0

    def start_refused(self, now: float) -> None:
        """The system refused a start. The first refusal of a round of starts counts, and
        sets when to try again; the others of that round change nothing."""
        if self.retry_at is None:
            self.refused += 1
            self.retry_at = now + doubling(
                START_RETRY_FIRST_SECONDS, self.refused, START_RETRY_MAX_SECONDS)

    def retry_due(self) -> None:
        """The wait after a refusal is over: starts may be tried again."""
        self.retry_at = None

    def worker_ready(self) -> None:
        """A worker started: the system has room again, and the other slots start now."""
        self.refused = 0
        self.retry_at = None

"""The running totals behind ``ProcessPool.stats()``: how tasks ended and how workers died.

Owns: ``Counters`` and ``Outcome``. The snapshot they make is ``_stats.PoolStats``, imported
only when one is made (see ``_stats``).
Runs in: the dispatcher thread alone changes ``Counters``, as it ends tasks and reaps
workers (see ``_stats`` for when a snapshot is taken, and what its counts promise).
"""

from __future__ import annotations

import collections
import enum
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._stats import PoolStats, WorkerStats


class Outcome(enum.Enum):
    """How a task ended, as ``PoolStats`` counts it (see its docstring)."""

    __hash__ = object.__hash__  # looked up once per task: identity, no Python code

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    TIMED_OUT = "timed_out"


class Counters:
    """Running totals, changed by the dispatcher thread only (see the module docstring)."""

    __slots__ = ("submitted", "workers_started", "starts_refused", "tasks_by_outcome",
                 "deaths_by_cause")

    def __init__(self) -> None:
        self.submitted = self.workers_started = self.starts_refused = 0
        self.tasks_by_outcome = dict.fromkeys(Outcome, 0)
        self.deaths_by_cause: collections.Counter[str] = collections.Counter()

    def ended(self, outcome: Outcome) -> None:
        self.tasks_by_outcome[outcome] += 1

    def worker_died(self, exitcode: int | None) -> None:
        self.deaths_by_cause[death_cause(exitcode)] += 1

    def snapshot(self, queued: int, running: int, workers: tuple[WorkerStats, ...]
                 ) -> PoolStats:
        from ._stats import PoolStats
        by_outcome, by_cause = self.tasks_by_outcome, self.deaths_by_cause
        return PoolStats(
            submitted=self.submitted, queued=queued, running=running,
            completed=by_outcome[Outcome.COMPLETED], failed=by_outcome[Outcome.FAILED],
            cancelled=by_outcome[Outcome.CANCELLED], stopped=by_outcome[Outcome.STOPPED],
            timed_out=by_outcome[Outcome.TIMED_OUT], workers_started=self.workers_started,
            worker_deaths=sum(by_cause.values()), deaths_by_cause=dict(by_cause),
            starts_refused=self.starts_refused, workers=workers)


def death_cause(exitcode: int | None) -> str:
    """``"SIGSEGV"``, ``"exit code 3"``: how a worker ended, as a short key."""
    if exitcode is None:
        return "not reaped"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"

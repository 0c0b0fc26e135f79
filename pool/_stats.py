"""What a pool has done and is doing: the counts behind ``ProcessPool.stats()``.

Owns: ``PoolStats`` and ``WorkerStats``, the public snapshot, frozen (``dataclasses``, so
that ``dataclasses.asdict`` gives a snapshot as a dict). The running totals behind it are
``_counts.Counters``, which the dispatcher imports without this module: ``dataclasses``
costs a program's first pool 13 ms to import, and a snapshot is first made when a caller
asks for one, or as the pool ends.
Runs in: only the dispatcher thread changes ``Counters``, as it ends tasks and reaps
workers. A snapshot is taken on that thread when a caller asks, after every command the
caller queued before. So the counts of one snapshot agree with each other, and a task the
caller just cancelled is counted cancelled. The caller's thread then adds each worker's
resident memory, read from ``/proc``: nothing asks a worker anything.
Guarantees: every task the pool accepted is in exactly one of ``queued``, ``running``,
``completed``, ``failed``, ``cancelled``, ``stopped`` and ``timed_out``, and
``submitted`` is their sum. A ``map`` chunk is one task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from . import _platform
from ._errors import TaskInfo


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """One live worker process, as :meth:`pool.ProcessPool.stats` saw it."""

    pid: int
    tasks_run: int                   # tasks it finished (a result or an exception)
    current_task: TaskInfo | None    # what it is running, if anything
    running_for: float | None        # seconds the current task has been running
    rss: int | None                  # resident memory in bytes (None where /proc is absent)


@dataclass(frozen=True, slots=True, repr=False)
class PoolStats:
    """A snapshot of a pool's counts, from :meth:`pool.ProcessPool.stats`.

    Tasks (a ``map`` chunk is one task), each counted in exactly one of:

    ==============  ==================================================================
    ``queued``      not started: in the pool's queue, or sent ahead into a worker's pipe
    ``running``     a worker is running it
    ``completed``   returned a result
    ``failed``      raised, or failed because of the pool: its worker died, sent garbage,
                    or no worker could start (``InitializerError``, ``WorkerStartRefused``)
    ``cancelled``   cancelled before it started (``cancel()``, ``stop()``, shutdown's
                    ``cancel_futures``, a ``map`` left early)
    ``stopped``     stopped while running: ``stop()``, ``terminate_workers()``,
                    ``kill_workers()`` (its future ended cancelled or ``WorkerTerminated``)
    ``timed_out``   ran longer than its timeout (``TaskTimeout``)
    ==============  ==================================================================

    ``submitted`` is their sum. Calls that could not be pickled never reach the pool and
    are not counted.

    Workers: ``workers_started`` processes were started so far. ``worker_deaths`` of them
    ended without being asked to: killed by a signal, an ``os._exit``, a crash while
    starting. ``deaths_by_cause`` counts them by cause (``"SIGKILL"``, ``"exit code 3"``).
    ``workers`` are the live ones, by slot.
    """

    submitted: int
    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int
    stopped: int
    timed_out: int
    workers_started: int
    worker_deaths: int
    deaths_by_cause: dict[str, int]     # a copy: the snapshot's own
    starts_refused: int
    workers: tuple[WorkerStats, ...]

    def __repr__(self) -> str:
        counts = [f"{self.running} running", f"{self.queued} queued",
                  f"{self.completed} completed"]
        counts += [f"{n} {name}" for name, n in (
            ("failed", self.failed), ("cancelled", self.cancelled), ("stopped", self.stopped),
            ("timed out", self.timed_out)) if n]
        workers = f"{len(self.workers)} workers ({self.workers_started} started"
        if self.worker_deaths:
            causes = ", ".join(f"{cause} x{n}" for cause, n in self.deaths_by_cause.items())
            workers += f", {self.worker_deaths} died: {causes}"
        if self.starts_refused:
            workers += f", {self.starts_refused} starts refused"
        return f"<PoolStats {', '.join(counts)}; {workers})>"


def with_memory(stats: PoolStats) -> PoolStats:
    """The snapshot with each live worker's resident memory filled in (caller's thread)."""
    if not stats.workers:
        return stats
    return replace(stats, workers=tuple(replace(w, rss=resident_bytes(w.pid))
                                        for w in stats.workers))


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int | None:
    """A process's resident set size from ``/proc`` (Linux); None where there is none
    (``_platform.PROC``), or once the process is gone."""
    if not _platform.PROC:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None

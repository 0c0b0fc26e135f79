"""How a task's future ends, and the errors the pool builds for it.

Owns: the functions that resolve futures and build ``WorkerDied``, ``TaskTimeout``,
``WorkerTerminated``, ``InitializerError`` and ``WorkerStartRefused``, and the record of why
workers failed to start.
Runs in: the dispatcher thread.
Guarantees: resolving never raises (a future the caller cancelled meanwhile is left as it
is); no user code runs here: messages that show user objects are built lazily by the
exceptions themselves.
Assumes: a submission's future is resolved here and nowhere else, once.
"""

from __future__ import annotations

import errno
import logging
import traceback
from typing import Any

from .._compat import death_cause
from .._core.actions import Fail, FailCause
from .._errors import (InitializerError, TaskInfo, TaskTimeout, WorkerDied,
                       WorkerStartRefused, WorkerTerminated, describe_exit)
from .._futures import PoolFuture
from .._worker.handle import Exit
from .._worker.progress import ITEM_PROGRESS

logger = logging.getLogger("pool")


class StartFailureReport:
    """Why the last worker failed to start, for the error the waiting tasks get."""

    def __init__(self, pool_name: str) -> None:
        self._pool_name = pool_name
        self._last = ""
        self._cause: BaseException | None = None

    def worker_ended(self, start_error: BaseException | None, exited: Exit) -> None:
        """A worker ended before it was ready (``start_error``: what its initializer raised)."""
        if start_error is not None:
            text = getattr(start_error, "remote_traceback", None) or "".join(
                traceback.format_exception(start_error))
            self._last = f"the initializer raised:\n{text.rstrip()}"
        else:
            self._last = (f"worker pid {exited.pid} ended while starting "
                          f"({describe_exit(exited.exitcode)})")
            if exited.crash_report:
                self._last += f"\nCrash report:\n{exited.crash_report}"
        self._cause = start_error
        logger.warning("%s: worker failed to start: %s", self._pool_name, self._last)

    def spawn_raised(self, exc: BaseException) -> None:
        self._last = f"starting the process failed: {format_error(exc)}"
        if isinstance(exc, RuntimeError) and "interpreter shutdown" in str(exc):
            # 3.12 refuses fork() once the main script has returned, even while the exit
            # waits for submitted work: a fork worker cannot start then.
            self._last += (" (this Python does not fork once the main script has returned: "
                           "wait for the results before the script ends, or use the "
                           "forkserver or spawn start method)")
        self._cause = exc
        logger.warning("%s: %s", self._pool_name, self._last)

    def refused(self, exc: BaseException, in_a_row: int) -> None:
        """The system refused to start a worker (``is_refusal``), for the ``in_a_row``-th
        round of starts in a row. Logged once a streak, not at every try."""
        self._last = f"the system refused to start a worker: {format_error(exc)}{_limit_hint(exc)}"
        exc.__traceback__ = None  # its frames hold the dispatcher: keep the error alone
        self._cause = exc
        if in_a_row == 1:
            logger.warning("%s: %s; trying again, less and less often", self._pool_name,
                           self._last)

    def refused_error(self, in_a_row: int) -> WorkerStartRefused:
        error = WorkerStartRefused(
            f"no worker could run this task: {self._last} ({in_a_row} tries in a row). "
            f"The pool keeps trying; tasks submitted later run once a worker starts.")
        error.__cause__ = self._cause
        return error

    def error(self, limit: int) -> InitializerError:
        error = InitializerError(
            f"workers failed to start {limit} times in a row; the pool stopped starting "
            f"them. Last failure: {self._last}")
        error.__cause__ = self._cause
        return error


def resolve(future: PoolFuture[Any], result: Any, exception: BaseException | None) -> None:
    """Set the outcome (a stopped future ends cancelled instead: ``PoolFuture``)."""
    try:
        if exception is None:
            future.set_result(result)
        else:
            future.set_exception(exception)
    except Exception:  # InvalidStateError: the caller cancelled it while it was queued
        pass


def failure(action: Fail, info: TaskInfo) -> BaseException:
    """The error for a task whose worker ended while running it (it died, timed out, or
    was terminated)."""
    exited: Exit = action.exited
    error: BaseException
    if action.cause is FailCause.TIMED_OUT:
        assert action.timeout is not None
        error = TaskTimeout(action.timeout, exited.pid, info, exited.crash_report)
    elif action.cause is FailCause.TERMINATED:
        return WorkerTerminated(exited.pid, exited.exitcode, info)
    else:
        error = WorkerDied(exited.pid, exited.exitcode, info, exited.crash_report,
                           exited.ended_because)
        # Only where there is one: even a None cause would hide the context the caller's
        # traceback shows (it sets __suppress_context__).
        cause = death_cause(exited.pid, exited.exitcode)
        if cause is not None:
            error.__cause__ = cause
    progress = exited.progress
    if progress is not None and progress.task_id == info.task_id:
        # What the task's chunk finished before the end: its face delivers those items
        # and fails only the one that was running (pool.Pool: _mp_chunks).
        setattr(error, ITEM_PROGRESS, progress)
    return error


# What the system says when it is out of a resource: descriptors (per process, system-wide),
# processes (fork's EAGAIN under RLIMIT_NPROC), memory, buffer space.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM,
                               errno.ENOBUFS, errno.ENOSPC})


def is_refusal(exc: BaseException) -> bool:
    """Starting a worker failed for want of a resource, not because of anything the worker
    does: worth trying again later. (A forkserver that could not fork, or lost a request
    to a refused descriptor, exits; the next start's connection to it fails, and starts a
    new one once the old one is reaped.)"""
    if isinstance(exc, (MemoryError, ConnectionError, EOFError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES


def _limit_hint(exc: BaseException) -> str:
    """The limit behind a refusal, as the user would look it up."""
    if not isinstance(exc, OSError):
        return ""
    try:
        import resource
    except ImportError:  # not POSIX
        return ""
    if exc.errno == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return f" (the descriptor limit, RLIMIT_NOFILE, is {soft} per process)"
    if exc.errno == errno.EAGAIN and hasattr(resource, "RLIMIT_NPROC"):
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        return f" (the process limit, RLIMIT_NPROC, is {shown} processes for this user)"
    if exc.errno == errno.ENFILE:
        return " (the system's table of open files is full)"
    return ""


# What each worker holds open in the parent: its task pipe, a second reader of it, its
# reply pipe, its crash report, its progress file, its sentinel, its loan desk and the
# segment lent to it (_wire.loans), and a spare for a large frame's writer.
PARENT_DESCRIPTORS_PER_WORKER = 9


def warn_if_descriptors_short(pool_name: str, max_workers: int) -> None:
    """Say at once, in the constructor, what ``max_workers`` cannot have: the process's
    descriptor limit caps how many workers can run (the rest would be refused, and
    retried, for as long as the pool lives)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_workers * PARENT_DESCRIPTORS_PER_WORKER + 64  # and the process's own
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    logger.warning(
        "%s: max_workers=%d needs about %d descriptors in this process, but its limit "
        "(RLIMIT_NOFILE) is %d: about %d workers can run at once, and starting the rest "
        "will be refused and retried. Raise the limit (ulimit -n, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, ...)) to run them all.", pool_name,
        max_workers, needed, soft, max(1, (soft - 64) // PARENT_DESCRIPTORS_PER_WORKER))


def format_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"

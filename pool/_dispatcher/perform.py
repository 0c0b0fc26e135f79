"""Carrying out the state machine's actions, on the workers and the tasks in flight.

Owns: one ``WorkerHandle`` per live worker (by slot), the ``Submission`` of every task the
loop took in and has not ended, the pool's lifeline pipe, the ``Counters`` behind
``stats()``, and the record of why workers failed to start.
Runs in: the dispatcher thread only, but for ``open``, called before it starts, and
``close_in_forked_child``, in a forked child.
Guarantees:
- every action is carried out in one ``match``, in the order the machine gave; what an
  action leads to comes after the actions already given (what an abandoned worker's exit
  leads to, at once); ``Resolve`` and ``Send``, one of each for every task, are matched
  first;
- every task the loop took in ends exactly once: resolved, failed, or cancelled, and counted
  once as it ends;
- no user code runs here: futures end through ``outcomes.resolve`` (their callbacks run on
  the ``CallbackRunner``), and the errors that show user objects build their messages
  lazily.
Assumes: the machine never names a task it was not told of, nor a slot's worker when the
slot has none, except where an action says so (a worker asked to end may be gone already).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from .._core.actions import (Action, AskToExit, Broken, Cancel, Departure, DumpStack, Fail,
                             FailCause, Misbehaved, Reclaim, Resolve, Send, Signal, Spawn,
                             Stopped, Unreaped, WorkerGone)
from .._core.machine import StateMachine
from .._core.start_failures import MAX_START_FAILURES
from .._errors import WorkerDied, WorkerProtocolError, copy_error, describe_exit
from .._counts import Counters, Outcome
from .._wire import shared_calls
from .._worker import teardown
from .._worker.handle import WorkerHandle
from .._worker.main import Initializer
from .._worker.main_guard import keep_main_importable
from .._worker.progress import ITEM_PROGRESS
from .commands import Front, Submission
from .outcomes import StartFailureReport, failure, is_refusal, resolve
from .reaper import Reaper
from .wakeup import Wakeup

logger = logging.getLogger("pool")


class Performer:
    """The loop's hands: it carries out what the machine decides, on what it owns."""

    def __init__(self, front: Front, machine: StateMachine, reaper: Reaper, *,
                 mp_context: Any, initializer: Initializer | None,
                 max_tasks_per_child: int | None, max_memory_per_child: int | None) -> None:
        self.name = front.name
        self._front = front
        self._machine = machine
        self._reaper = reaper
        self._ctx = mp_context
        self._fork = mp_context.get_start_method() == "fork"
        self._initializer = initializer
        self._max_tasks = max_tasks_per_child
        self._max_memory = max_memory_per_child
        self.workers: dict[int, WorkerHandle] = {}  # a slot's index -> its live worker
        self.submissions: dict[int, Submission] = {}  # by task id
        self.counters = Counters()
        self._start_failure_report = StartFailureReport(self.name)
        self._wakeup: Wakeup | None = None
        self._lifeline: tuple[int, int] | None = None

    @property
    def opened(self) -> bool:
        return self._lifeline is not None

    def open(self, wakeup: Wakeup) -> None:
        """Open the lifeline every worker inherits, before the loop starts. ``wakeup``
        wakes the loop once a thread has written a large frame."""
        self._wakeup = wakeup
        self._lifeline = os.pipe()

    def close(self) -> None:
        """Close the lifeline, once every worker is gone."""
        assert self._lifeline is not None
        teardown.close_fds(*self._lifeline)

    def close_in_forked_child(self) -> None:
        """In a child that some thread of ours forked: close the copies of the descriptors
        that decide when workers exit, so that a long-lived child cannot keep the workers
        of a dead parent alive (lifeline) or keep a worker asked to stop from seeing end of
        file (task pipes)."""
        fds = [self._lifeline[1]] if self._lifeline is not None else []
        for worker in list(self.workers.values()):
            fds += worker.task_pipe_fds()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def perform(self, actions: list[Action]) -> None:
        """Carry out actions in order, and those they lead to after them."""
        work = list(actions)
        for action in work:  # what an action leads to is appended: this loop reaches it
            match action:
                # Every task causes one of each of the first two. A class pattern is an
                # isinstance test, made in order: they come first.
                case Resolve():
                    submission = self.submissions.pop(action.task_id)
                    ok, value = action.outcome
                    self._count_end(submission, Outcome.COMPLETED if ok else Outcome.FAILED)
                    resolve(submission.future, value if ok else None, None if ok else value)
                case Send():
                    if more := self._send(action.index, self.submissions[action.task_id]):
                        work += more
                case Fail():
                    self._fail(action)
                case WorkerGone():
                    self._departed(action)
                case Misbehaved():
                    worker = self.workers[action.index]
                    worker.misbehaved = action.reason
                    logger.error("%s: worker pid %d sent %s; killing it", self.name, worker.pid,
                                 action.reason)
                case Stopped():
                    self._end_cancelled(action.task_id, ran=action.ran)
                case Cancel():
                    self._end_cancelled(action.task_id, ran=False)
                case Spawn():
                    work += self._spawn(action.index)
                case Reclaim():
                    taken_back = self.workers[action.index].reclaim()
                    work += self._machine.tasks_reclaimed(action.index, taken_back)
                # The next three end the slot's worker. There may be none: a start that
                # failed later in the same batch of actions (the machine asked a STARTING
                # slot to stop, then heard that its start failed: ``spawn_failed``).
                case AskToExit():
                    if (ending := self.workers.get(action.index)) is not None:
                        ending.close_task_pipe()
                case Signal():
                    if (ending := self.workers.get(action.index)) is not None:
                        ending.signal(action.signum)
                case DumpStack():
                    if (ending := self.workers.get(action.index)) is not None:
                        ending.dump_stack()
                case Unreaped():
                    self._abandon(action.index)
                case Broken():
                    self._front.pool_broken(self._start_failure_report.error(MAX_START_FAILURES))
                case _:
                    raise AssertionError(f"unknown action {action!r}")

    def _send(self, index: int, submission: Submission) -> list[Action]:
        """Queue a task's call for a worker; ``flush`` writes it at the end of the turn."""
        if not submission.marked_running:
            if not submission.future.set_running_or_notify_cancel():
                self.counters.ended(Outcome.CANCELLED)
                self.submissions.pop(submission.info.task_id)
                return self._machine.send_cancelled(index, submission.info.task_id)
            submission.marked_running = True
        self.workers[index].send(submission.info.task_id, submission.body,
                                 submission.frame_bytes)
        return []

    def _fail(self, action: Fail) -> None:
        """Fail a task with the error its cause calls for, and count how it ended."""
        submission = self.submissions.pop(action.task_id)
        exited = action.exited
        if exited is None or exited.exitcode is None or exited.group_left:
            # Its worker may still view the call's segment: alive (it misbehaved), not
            # reaped, or with processes left in its group.
            shared_calls.retire(submission.body)
        cause = action.cause
        outcome = Outcome.FAILED
        if cause is FailCause.BROKEN:  # Broken came first and set the error
            assert self._front.broken_error is not None
            error = copy_error(self._front.broken_error)
        elif cause is FailCause.REFUSED:
            error = self._start_failure_report.refused_error(self._machine.refused_starts)
        elif cause is FailCause.MISBEHAVED:
            assert action.index is not None
            error = WorkerProtocolError(
                f"worker pid {self.workers[action.index].pid} sent bytes that are not a "
                f"reply while running {submission.info.describe()}: {action.reason}")
        else:
            error = failure(action, submission.info)
            if isinstance(error, WorkerDied):
                self._log_death(error)
            if cause is FailCause.TIMED_OUT:
                outcome = Outcome.TIMED_OUT
            elif cause is FailCause.TERMINATED:
                outcome = Outcome.STOPPED
        self._count_end(submission, outcome)
        resolve(submission.future, None, error)

    def _log_death(self, error: WorkerDied) -> None:
        """One WARNING per worker that died while running a task (the caller may never
        look at the future: a fire-and-forget submit), with the facts in ``extra`` for
        structured handlers. An idle worker's death is logged in ``_departed``; a timeout
        or a stop, which the pool itself caused, is not a death to warn of."""
        progress = getattr(error, ITEM_PROGRESS, None)
        # A chunk that recorded its items (pool.Pool's) loses only the one it was running.
        where = ("" if progress is None else
                 f", after {progress.finished} of its chunk's items had finished")
        logger.warning(
            "%s: worker pid %d died (%s) while running %s; that task failed with "
            "WorkerDied%s", self.name, error.pid, describe_exit(error.exitcode),
            error.task.describe(), where,
            extra={"pool_event": "worker_died", "pool_name": self.name,
                   "pool_worker_pid": error.pid, "pool_exitcode": error.exitcode,
                   "pool_signal": error.signal_name, "pool_task": error.task.describe(),
                   "pool_task_id": error.task.task_id})

    def _count_end(self, submission: Submission, outcome: Outcome) -> None:
        """Count how a task that ran ended (for ``stats()``): a task its caller stopped
        while it ran ends cancelled, whatever came back, so it counts as stopped."""
        self.counters.ended(Outcome.STOPPED if submission.future._stop_requested else outcome)

    def _end_cancelled(self, task_id: int, *, ran: bool) -> None:
        """End a task cancelled by shutdown or stopped by its caller. It ends cancelled even
        if it was already marked running: a task taken back unread from a worker's pipe."""
        submission = self.submissions.pop(task_id)
        self.counters.ended(Outcome.STOPPED if ran else Outcome.CANCELLED)
        if ran:  # its worker was ended, but how is not told here: what it left may view it
            shared_calls.retire(submission.body)
        submission.future._end_cancelled()

    def _departed(self, action: WorkerGone) -> None:
        """Count and log a worker's exit as the machine says it left."""
        exited = action.exited
        if action.departure is Departure.ASKED:
            return  # the pool was ending it: not a death
        self.counters.worker_died(exited.exitcode)
        if action.departure is Departure.AT_START:
            self._start_failure_report.worker_ended(exited.start_error, exited)
        elif action.departure is Departure.IDLE:
            logger.warning("%s: idle worker pid %d died (%s); replacing it%s", self.name,
                           exited.pid, describe_exit(exited.exitcode),
                           f". {exited.ended_because}" if exited.ended_because else "")

    def _abandon(self, index: int) -> None:
        """The slot's worker outlived SIGKILL's grace: the reaper keeps it, and the slot
        gets a new worker."""
        exited = self._reaper.abandon(self.forget_worker(index))
        self.perform(self._machine.worker_exited(
            index, unread_bytes=exited.unread_task_bytes, exited=exited,
            lost_track=bool(exited.ended_because)))

    def _spawn(self, index: int) -> list[Action]:
        assert self._lifeline is not None and self._wakeup is not None
        inherited = None
        if self._fork:  # a forked child holds copies of everything: say what to close
            inherited = (self._lifeline[1], *self._wakeup.fds,
                         *(fd for w in self.workers.values() for fd in w.parent_fds()))
        else:  # the worker imports the main script again: it must still be named
            keep_main_importable()
        try:
            self.workers[index] = WorkerHandle.start(
                self._ctx, f"{self.name}-worker-{index}", lifeline_fd=self._lifeline[0],
                initializer=self._initializer, max_tasks=self._max_tasks,
                max_memory=self._max_memory, inherited_fds=inherited,
                on_write_done=self._wakeup.wake)
        except Exception as exc:
            if is_refusal(exc):
                self.counters.starts_refused += 1
                self._start_failure_report.refused(exc, self._machine.refused_starts + 1)
                return self._machine.spawn_refused(index)
            self._start_failure_report.spawn_raised(exc)
            return self._machine.spawn_failed(index)
        self.counters.workers_started += 1
        self._publish_processes()
        return []

    # -- what the loop asks of it, besides actions ----------------------------------------

    def take_in(self, submission: Submission) -> None:
        """Track a submission the machine is about to be told of."""
        self.counters.submitted += 1
        self.submissions[submission.info.task_id] = submission

    def refuse(self, submission: Submission) -> None:
        """End a submission the loop will not queue: one its caller cancelled before the
        loop saw it (it ends cancelled, and ``wait`` hears of it), or one that reached the
        loop after the pool closed (a caller queued it just as a broken pool ended by
        itself, before it could see ``broken_error``) or failed (with ``broken_error``)."""
        self.counters.submitted += 1
        broken = self._front.broken_error
        self._end_unrun(submission, copy_error(broken) if broken is not None
                        else RuntimeError("cannot schedule new futures after shutdown"))

    def fail_all(self, error: BaseException) -> None:
        """The loop failed: end every task it took in with ``error``. Their workers are
        killed after, so no call's segment is reused: a worker may still view it."""
        for submission in self.submissions.values():
            shared_calls.retire(submission.body)
            self._end_unrun(submission, copy_error(error))
        self.submissions.clear()

    def take_back_idle_loans(self) -> bool:
        """Take back the segments lent to workers with nothing in flight, where they hold
        memory (``_wire.loans.LoanDesk.take_back``). True if a busy worker still holds
        one: ask again later."""
        held = False
        for index, worker in self.workers.items():
            desk = worker.desk
            if desk is None or desk.loan is None or not desk.loan.size:
                continue
            if (self._machine.running_task(index) is None and not worker.outbox
                    and worker.writer is None):
                desk.take_back()
            else:
                held = True
        return held

    def kill_all(self) -> None:
        """SIGKILL every worker and its process group (the loop failed)."""
        for worker in self.workers.values():
            worker.signal(signal.SIGKILL)

    def _end_unrun(self, submission: Submission, error: BaseException) -> None:
        """End a task that will never run: cancelled if its caller cancelled it (so that
        ``wait`` and ``as_completed`` hear of it), else failed with ``error``."""
        if submission.future.cancelled():
            self.counters.ended(Outcome.CANCELLED)
            submission.future._end_cancelled()
        else:
            self.counters.ended(Outcome.FAILED)
            resolve(submission.future, None, error)

    def forget_worker(self, index: int) -> WorkerHandle:
        """Take a gone worker out of its slot (and out of what callers see)."""
        worker = self.workers.pop(index)
        self._publish_processes()
        return worker

    def release_workers(self) -> None:
        """Reap every worker left (only after a failure)."""
        for index, worker in list(self.workers.items()):
            if worker.finish(sentinel_fired=False).exitcode is None:
                self._reaper.unreaped(worker, "could not be reaped")
            del self.workers[index]
        self._publish_processes()

    def publish_census(self) -> None:
        """Publish the census and the stats (on a caller's ``Sync``, and at the end)."""
        failed = self._front.failed  # then the machine's records describe nothing
        machine = self._machine
        queued, sent = census = (0, 0) if failed else machine.census()
        now = time.monotonic()
        from .._stats import WorkerStats  # (see _stats: not imported before it is needed)
        workers = []
        for index, worker in sorted(self.workers.items()):
            task_id = None if failed else machine.running_task(index)
            started = None if task_id is None else machine.started_at(task_id)
            workers.append(WorkerStats(
                pid=worker.pid, tasks_run=worker.tasks_run,
                current_task=None if task_id is None else self.submissions[task_id].info,
                running_for=None if started is None else now - started, rss=None))
        running = 0 if failed else machine.running_count()
        self._front.publish_census(census, self.counters.snapshot(
            queued + sent - running, running, tuple(workers)))

    def _publish_processes(self) -> None:
        self._front.publish_processes({w.pid: w.process for w in self.workers.values()
                                       if w.process is not None})

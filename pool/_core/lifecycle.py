"""The pool's life: how it winds down, by shutdown, terminate, or workers that cannot start.

Owns: every move of ``PoolLife`` (open, draining, broken, terminating, closed) and what
each move does to the queue.
Runs in: the dispatcher thread, inside ``StateMachine``.
Guarantees:
- shutdown drains: what was submitted runs, or with ``cancel_futures`` only what was sent;
- terminate cancels what has not started and ends every worker now, running tasks
  included; a task running there fails as terminated;
- workers that keep failing to start break the pool: what is queued fails ``BROKEN``, and
  so does what is queued later once no READY worker is left to take it;
- starts refused too long fail what is queued ``REFUSED`` once no worker is left to run
  it; the pool stays open;
- an ending pool closes once no task is left and every slot is UNUSED or EMPTY.
Assumes: the machine schedules after each of these, which stops the workers left idle.
"""

from __future__ import annotations

from .actions import Action, Broken, Cancel, Fail, FailCause
from .escalation import Escalator
from .records import Records
from .start_failures import StartFailures
from .states import LIFE_TRANSITIONS, PoolLife, SlotState, TaskState


class Lifecycle:
    __slots__ = ("_records", "_starts", "_escalator")

    def __init__(self, records: Records, starts: StartFailures, escalator: Escalator) -> None:
        self._records = records
        self._starts = starts
        self._escalator = escalator

    def shutdown(self, cancel_futures: bool) -> list[Action]:
        """Drain, unless the pool is ending already; ``cancel_futures`` empties the queue."""
        records = self._records
        if records.life is PoolLife.OPEN:
            records.move_life(PoolLife.DRAINING)
        actions: list[Action] = []
        if cancel_futures:
            while records.queue:
                task_id = records.queue.popleft()
                records.move_task(records.tasks[task_id], TaskState.CANCELLED)
                actions.append(Cancel(task_id))
        return actions

    def terminate(self, signum: int) -> list[Action]:
        """End every worker now with ``signum``, after a shutdown that cancelled the queue."""
        records = self._records
        if records.life is not PoolLife.TERMINATING and records.life is not PoolLife.CLOSED:
            records.move_life(PoolLife.TERMINATING)
        actions: list[Action] = []
        for slot in records.slots:
            if slot.state is not SlotState.UNUSED and slot.state is not SlotState.EMPTY:
                actions += self._escalator.terminate(slot, signum)
        return actions

    def break_if_failing(self) -> list[Action]:
        """Workers keep failing to start: break the pool, fail what waits, start nothing
        more. A broken pool then ends as a draining one does. Nothing is started while
        terminating, so a terminating pool never breaks."""
        records = self._records
        if (not self._starts.too_many_failures
                or PoolLife.BROKEN not in LIFE_TRANSITIONS[records.life]):
            return []
        records.move_life(PoolLife.BROKEN)
        return [Broken()] + self.fail_queue(FailCause.BROKEN)

    def fail_stranded(self) -> list[Action]:
        """In a broken pool, what is queued once no READY worker is left fails: no worker
        will come for it."""
        records = self._records
        if (records.life is PoolLife.BROKEN and records.queue
                and not records.in_state[SlotState.READY]):
            return self.fail_queue(FailCause.BROKEN)
        return []

    def fail_if_refused_too_long(self) -> list[Action]:
        """Starts were refused too long, and no worker runs or starts to take what is
        queued: it fails rather than wait for a resource that may not come back."""
        in_state = self._records.in_state
        if self._starts.too_many_refused and not (
                in_state[SlotState.STARTING] or in_state[SlotState.READY]
                or in_state[SlotState.RETIRING]):
            return self.fail_queue(FailCause.REFUSED)
        return []

    def fail_queue(self, cause: FailCause) -> list[Action]:
        """Fail every queued task for ``cause``."""
        records = self._records
        actions: list[Action] = []
        while records.queue:
            task_id = records.queue.popleft()
            records.move_task(records.tasks[task_id], TaskState.FAILED)
            actions.append(Fail(task_id, cause))
        return actions

    def close_if_done(self) -> None:
        """An ending pool with no task left and no worker closes: the loop may end."""
        records = self._records
        if records.life is PoolLife.OPEN or records.life is PoolLife.CLOSED:
            return
        if (not records.queue and not records.tasks and
                all(s.state in (SlotState.UNUSED, SlotState.EMPTY) for s in records.slots)):
            records.move_life(PoolLife.CLOSED)

"""Placement: which worker runs which task, and taking tasks back from a worker's pipe.

Owns: each slot's tasks in flight, in send order; the rules of pipelining (which tasks may
wait in a worker's pipe behind the one it runs); each worker's task quota.
Runs in: the dispatcher thread, inside ``StateMachine``.
Guarantees:
- a task goes to an idle READY worker first. A small one, that fits one packet, may
  instead wait in the pipe of a READY worker that runs a small task, if that worker's
  last task ran shorter than ``SHORT_TASK_SECONDS``, its running task has run less than
  ``RECLAIM_AFTER_SECONDS``, and fewer than the pipeline depth are in flight there: it
  then never waits for the round trip. A stalled worker gets nothing;
- a worker runs its tasks in the order sent: the first in flight is RUNNING, the others
  ASSIGNED. A task's clock starts when it becomes the first;
- a task that turns out long does not hold up those behind it: once it has run
  ``RECLAIM_AFTER_SECONDS``, they are taken back from the pipe and run elsewhere, and no
  more are queued behind it;
- a task that never started goes back to the front of the queue, keeping its place, or
  is cancelled when the pool is terminating or its caller stopped it;
- a worker sent ``max_tasks_per_child`` tasks retires. If one of them comes back unsent
  or unread, it takes tasks again, unless it retires for its memory.
Assumes: ``Records`` moves every task and slot; the escalator ends a worker whose task
was stopped before it started.
"""

from __future__ import annotations

from collections import deque

from .actions import Action, Send, Stopped
from .escalation import Escalator
from .records import Records
from .stalls import stall, stalled
from .states import InvalidTransition, PoolLife, Slot, SlotState, Task, TaskState

SHORT_TASK_SECONDS = 0.001
RECLAIM_AFTER_SECONDS = 0.005


def reclaim_deadline(slot: Slot, head: Task) -> float | None:
    """When the tasks queued behind ``head``, running in ``slot``, are to be taken back;
    None if none are, or that was done already."""
    if len(slot.in_flight) > 1 and not head.kept_alone and head.started is not None:
        return head.started + RECLAIM_AFTER_SECONDS
    return None


class Placement:
    __slots__ = ("ahead_max_frame", "_records", "_escalator", "_depth", "_max_tasks")

    def __init__(self, records: Records, escalator: Escalator, *, depth: int,
                 ahead_max_frame: int, max_tasks_per_child: int | None) -> None:
        """``ahead_max_frame``: the largest frame, header included, that may be sent
        ahead, behind a running task."""
        self.ahead_max_frame = ahead_max_frame
        self._records = records
        self._escalator = escalator
        self._depth = depth
        self._max_tasks = max_tasks_per_child

    def assign(self) -> list[Action]:
        """Send queued tasks, in order, while a worker can take the first."""
        actions: list[Action] = []
        records = self._records
        queue, tasks = records.queue, records.tasks
        now = records.clock()
        while (task_id := queue.peek()) is not None:
            task = tasks[task_id]
            slot = self.pick_slot(task.pipelinable, now)
            if slot is None:
                break
            queue.drop_head()
            slot.in_flight.append(task_id)
            slot.worker.assigned_count += 1
            if self.quota_used(slot):
                records.move_slot(slot, SlotState.RETIRING)
            actions.append(Send(slot.index, task_id))
            if len(slot.in_flight) == 1:
                actions += self.start_running(slot, task, now)
            else:
                records.move_task(task, TaskState.ASSIGNED)
        return actions

    def pick_slot(self, pipelinable: bool, now: float) -> Slot | None:
        """An idle READY slot, else for a small task the READY slot where it may wait
        behind the running one with the fewest tasks in flight. One pass: this runs for
        every task."""
        best: Slot | None = None
        tasks = self._records.tasks
        for slot in self._records.slots:
            if slot.state is not SlotState.READY or stalled(slot, now):
                continue
            in_flight = slot.in_flight
            if not in_flight:
                return slot
            last_duration = slot.worker.last_duration
            if (pipelinable and slot.worker.pipelining and len(in_flight) < self._depth
                    and last_duration is not None and last_duration < SHORT_TASK_SECONDS
                    and (best is None or len(in_flight) < len(best.in_flight))):
                head = tasks[in_flight[0]]
                if (head.pipelinable and not head.kept_alone and head.started is not None
                        and now - head.started < RECLAIM_AFTER_SECONDS):
                    best = slot
        return best

    def start_running(self, slot: Slot, task: Task, now: float | None = None) -> list[Action]:
        """``task`` is now the one its worker runs: start its clock, or stop it at once.
        ``now``: the machine's clock, if the caller has just read it."""
        self._records.move_task(task, TaskState.RUNNING)
        task.started = started = self._records.clock() if now is None else now
        if task.stop_requested:
            return self._escalator.stop_running(slot)
        if task.timeout is not None:
            task.deadline = started + task.timeout
        return []

    def quota_used(self, slot: Slot) -> bool:
        return self._max_tasks is not None and slot.worker.assigned_count >= self._max_tasks

    def reopen_if_quota_left(self, slot: Slot) -> None:
        """A task sent to the slot was taken back: if that gave its worker room in its
        quota again, it takes tasks again, unless it retires for its memory."""
        if (slot.state is SlotState.RETIRING and not self.quota_used(slot)
                and not slot.worker.over_memory):
            self._records.move_slot(slot, SlotState.READY)

    def withdraw(self, slot: Slot, task_id: int) -> list[Action]:
        """Take back a task the dispatcher was told to send but did not deliver."""
        if task_id not in slot.in_flight:
            raise InvalidTransition(
                f"withdrawing task {task_id}, not sent to slot {slot.index}")
        was_running = slot.in_flight[0] == task_id
        slot.in_flight.remove(task_id)
        slot.worker.assigned_count -= 1
        if not slot.in_flight:
            slot.worker.idle_since = self._records.clock()
        if was_running and slot.in_flight:
            return self.start_running(slot, self._records.tasks[slot.in_flight[0]])
        return []

    def taken_back(self, slot: Slot, task_ids: list[int], checking_read: bool
                   ) -> list[Action]:
        """These tasks, in send order, were taken back from the slot's pipe unread. The
        worker reads its pipe meanwhile, so it may have got a later one while an earlier
        one was taken back: what it got stays in flight, in order, and if the task
        believed running was taken back, the first of those runs. ``checking_read``: the
        Reclaim was to see whether the worker read its running task."""
        taken = set(task_ids)
        in_flight = list(slot.in_flight)
        if [t for t in in_flight if t in taken] != task_ids:
            raise InvalidTransition(f"slot {slot.index} gave back {task_ids}, "
                                    f"not tasks in flight there {in_flight}")
        head_taken = in_flight[0] in taken
        slot.in_flight = deque(t for t in in_flight if t not in taken)
        now = self._records.clock()
        if not slot.in_flight:
            slot.worker.idle_since = now
        slot.worker.assigned_count -= len(task_ids)
        actions = self.requeue(task_ids)
        if head_taken and checking_read:  # sent long ago, and still not read
            stall(slot, now)
        if head_taken and slot.in_flight:
            actions += self.start_running(slot, self._records.tasks[slot.in_flight[0]])
        self.reopen_if_quota_left(slot)
        return actions

    def requeue_in_flight(self, slot: Slot) -> list[Action]:
        task_ids = list(slot.in_flight)
        slot.in_flight.clear()
        return self.requeue(task_ids)

    def requeue(self, task_ids: list[int]) -> list[Action]:
        """Tasks sent to a worker, in send order, that never started: they go back to the
        front of the queue so that they keep their place. When terminating, or when their
        caller asked to stop them, they are cancelled instead."""
        actions: list[Action] = []
        records = self._records
        for task_id in reversed(task_ids):
            task = records.tasks[task_id]
            if records.life is PoolLife.TERMINATING or task.stop_requested:
                records.move_task(task, TaskState.CANCELLED)
                actions.append(Stopped(task.task_id))
            else:
                records.move_task(task, TaskState.QUEUED)
                task.kept_alone = task.read_checked = False  # its next run is checked anew
                records.queue.appendleft(task.task_id)
        return actions

    def worker_gone(self, slot: Slot, unread_bytes: int, exited: object) -> list[Action]:
        """The slot's worker is gone, leaving ``unread_bytes`` of what it was sent unread.
        The last tasks sent whose frames lie wholly in those bytes certainly never started:
        they go back to the queue, even the first. A frame read in part counts as started:
        a worker unpickles a large call as it reads it, so user code, its reducers, may
        have run, perhaps the code that killed it; sent again, it would kill worker after
        worker. A task that started ends as the escalator says."""
        actions: list[Action] = []
        if slot.in_flight and self._unstarted(slot, unread_bytes) < len(slot.in_flight):
            actions.append(self._escalator.end_running_task(slot, exited))
        return actions + self.requeue_in_flight(slot)

    def _unstarted(self, slot: Slot, unread_bytes: int) -> int:
        """How many of the last tasks sent to the slot lie wholly in ``unread_bytes``."""
        count, later_frames = 0, 0
        for task_id in reversed(slot.in_flight):
            later_frames += self._records.tasks[task_id].frame_bytes
            if unread_bytes < later_frames:
                break
            count += 1
        return count

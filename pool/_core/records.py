"""The machine's records, and the one place that moves a task, a slot or the pool.

Owns: the tasks by id, the queue of waiting tasks, the slots, the pool's life and how many
slots are in each state.
Runs in: the dispatcher thread, through ``StateMachine`` and its parts, which share one
``Records``.
Guarantees: a task, a slot or the pool moves only by ``move_task``, ``move_slot`` or
``move_life``, and only as the tables in ``states`` allow: any other move raises
``InvalidTransition``. What a move resets, it resets here, in sight: an ended task leaves
the records, a task that stops running loses its deadline, a slot that empties forgets
its worker and its ending.
Assumes: the clock never goes back.
"""

from __future__ import annotations

import collections
from collections import deque
from typing import Callable, Iterator, Mapping

from .states import (LIFE_TRANSITIONS, SLOT_TRANSITIONS, TASK_ENDS, TASK_TRANSITIONS,
                     InvalidTransition, PoolLife, Slot, SlotState, Task, TaskState,
                     WorkerLife)


class TaskQueue:
    """The tasks waiting for a worker, in order: ``append``, and ``appendleft`` for those
    that go back to the front. A task that leaves from the middle, because its caller
    cancelled it, costs O(1): its id stays where it is, no longer among the live tasks, and
    is dropped when it reaches the front. Cancelling thousands of queued tasks is then
    linear, not quadratic. ``len``, iteration and ``peek`` see live tasks only."""

    __slots__ = ("_ids", "_live", "_dead")

    def __init__(self, live: Mapping[int, object]) -> None:
        self._ids: deque[int] = deque()
        self._live = live   # the machine's tasks by id: a queued id not in it has ended
        self._dead = 0      # ids in _ids that are not live

    def __len__(self) -> int:
        return len(self._ids) - self._dead

    def __bool__(self) -> bool:
        return len(self._ids) > self._dead

    def __iter__(self) -> Iterator[int]:
        return (task_id for task_id in self._ids if task_id in self._live)

    def append(self, task_id: int) -> None:
        self._ids.append(task_id)

    def appendleft(self, task_id: int) -> None:
        self._ids.appendleft(task_id)

    def forget_ended(self) -> None:
        """A queued task has just ended, wherever it stood: its id goes when it reaches
        the front."""
        self._dead += 1

    def peek(self) -> int | None:
        """The first live task, or None if there is none."""
        self._prune()
        return self._ids[0] if self._ids else None

    def drop_head(self) -> None:
        """Remove the first task, which ``peek`` just returned."""
        self._ids.popleft()

    def popleft(self) -> int:
        self._prune()
        return self._ids.popleft()

    def _prune(self) -> None:
        ids = self._ids
        while ids and ids[0] not in self._live:
            ids.popleft()
            self._dead -= 1


class Records:
    """The records every part of the machine reads, and the moves that change them."""

    __slots__ = ("clock", "slots", "tasks", "queue", "life", "in_state")

    def __init__(self, max_workers: int, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.slots = [Slot(i) for i in range(max_workers)]
        self.tasks: dict[int, Task] = {}  # tasks queued or in flight; an ended one leaves
        self.queue = TaskQueue(self.tasks)
        self.life = PoolLife.OPEN
        # How many slots are in each state: lets the passes over the slots that run on
        # every event be skipped when they cannot do anything. Every state has a key from
        # the start: a missing one costs a Python __missing__ call on every read.
        self.in_state = collections.Counter({state: 0 for state in SlotState})
        self.in_state[SlotState.UNUSED] = max_workers

    def move_task(self, task: Task, new: TaskState) -> None:
        if new not in TASK_TRANSITIONS[task.state]:
            raise InvalidTransition(f"task {task.task_id}: {task.state.name} -> {new.name}")
        task.state = new
        if new in TASK_ENDS:
            del self.tasks[task.task_id]
        elif new is not TaskState.RUNNING:
            task.deadline = None

    def move_slot(self, slot: Slot, new: SlotState) -> None:
        if new not in SLOT_TRANSITIONS[slot.state]:
            raise InvalidTransition(f"slot {slot.index}: {slot.state.name} -> {new.name}")
        self.in_state[slot.state] -= 1
        self.in_state[new] += 1
        slot.state = new
        if new is SlotState.STARTING:
            slot.idled_out = False  # a new worker: it may be refilled at once again
        elif new is SlotState.READY and not slot.in_flight:
            slot.worker.idle_since = self.clock()
        elif new is SlotState.EMPTY:
            # Its worker is gone, and with it what was known of it and of its ending.
            slot.worker = WorkerLife()
            slot.stopping = None

    def move_life(self, new: PoolLife) -> None:
        if new not in LIFE_TRANSITIONS[self.life]:
            raise InvalidTransition(f"pool: {self.life.name} -> {new.name}")
        self.life = new

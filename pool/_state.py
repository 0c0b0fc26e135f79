"""The slot/task state machine: which task runs where, and what to do when anything happens.

Owns: the queue of waiting tasks, each slot's state and in-flight tasks, the pool's phase,
start-failure accounting and the stop-escalation deadlines.
Runs in: the dispatcher thread only. It performs no I/O: events come in as method calls and
leave as a list of actions for the dispatcher to carry out; time comes from the ``clock`` it
is given (``time.monotonic`` in the pool, a fake one in tests). It imports neither ``threading`` nor ``multiprocessing`` and is
unit-tested by feeding it events.
Guarantees:
- a task is sent to a worker once; a worker's tasks are run in the order they were sent, so
  the first in flight is the one running (RUNNING) and the rest are waiting (ASSIGNED);
- when a worker exits, only its RUNNING task fails; its ASSIGNED tasks go back to the front
  of the queue (they never started, so running them elsewhere is safe);
- every task ends in exactly one of DONE, FAILED or CANCELLED, and every slot ends EMPTY
  or UNUSED before the machine reports ``closed``;
- an impossible transition raises ``InvalidTransition`` at once (an internal error).
"""

from __future__ import annotations

import enum
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ._actions import (Action, Broken, Cancel, FailBroken, FailDied, FailMisbehaved, Resolve,
                       Send, Signal, Spawn, Stop, Unreaped)

__all__ = [
    "TaskState", "SlotState", "Phase", "Escalation", "InvalidTransition", "StateMachine",
    "Spawn", "Send", "Resolve", "FailDied", "FailMisbehaved", "FailBroken", "Cancel", "Stop",
    "Signal", "Broken", "Unreaped", "Action",
]


class InvalidTransition(RuntimeError):
    """An event arrived that the current state cannot accept: a bug in the pool."""


class TaskState(enum.Enum):
    QUEUED = "queued"        # waiting in the pool's queue
    ASSIGNED = "assigned"    # sent to a worker, behind the task that worker is running
    RUNNING = "running"      # the first task in flight on its worker
    DONE = "done"            # a reply arrived
    FAILED = "failed"        # its worker died or misbehaved, or the pool broke
    CANCELLED = "cancelled"  # cancelled before it was sent


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.QUEUED: frozenset({TaskState.ASSIGNED, TaskState.RUNNING, TaskState.CANCELLED,
                                 TaskState.FAILED}),
    TaskState.ASSIGNED: frozenset({TaskState.RUNNING, TaskState.QUEUED, TaskState.CANCELLED}),
    # RUNNING -> QUEUED only when the write to the worker failed: it never received it.
    TaskState.RUNNING: frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED,
                                  TaskState.QUEUED}),
    TaskState.DONE: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}


class SlotState(enum.Enum):
    UNUSED = "unused"      # never started; started on demand
    STARTING = "starting"  # process started, READY not yet received
    READY = "ready"        # takes tasks
    RETIRING = "retiring"  # takes no more tasks; stopped once its in-flight tasks are done
    STOPPING = "stopping"  # asked to exit; escalation deadlines run until it does
    EMPTY = "empty"        # its process exited and was reaped; refilled while the pool is open


SLOT_TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    SlotState.UNUSED: frozenset({SlotState.STARTING}),
    SlotState.STARTING: frozenset({SlotState.READY, SlotState.STOPPING, SlotState.EMPTY}),
    SlotState.READY: frozenset({SlotState.RETIRING, SlotState.STOPPING, SlotState.EMPTY}),
    # RETIRING -> READY when the task that used up its quota was cancelled before sending.
    SlotState.RETIRING: frozenset({SlotState.READY, SlotState.STOPPING, SlotState.EMPTY}),
    SlotState.STOPPING: frozenset({SlotState.EMPTY}),
    SlotState.EMPTY: frozenset({SlotState.STARTING}),
}


class Phase(enum.Enum):
    OPEN = "open"          # accepting tasks; slots that emptied are refilled
    DRAINING = "draining"  # shutdown asked: finish what was submitted, then stop every worker
    CLOSED = "closed"      # every task resolved and every worker gone


class Escalation(enum.Enum):
    """How hard a STOPPING slot has been asked to exit (each step has a grace deadline)."""

    ASKED = "asked"            # its task pipe was closed: a worker exits at end of file
    TERMINATED = "terminated"  # SIGTERM sent to it and its process group
    KILLED = "killed"          # SIGKILL sent to it and its process group
    GIVEN_UP = "given up"      # still not gone after SIGKILL's grace: reported, not assumed


# --- records ----------------------------------------------------------------------------------

@dataclass
class _Task:
    task_id: int
    pipelinable: bool
    state: TaskState = TaskState.QUEUED


@dataclass
class Slot:
    index: int
    state: SlotState = SlotState.UNUSED
    in_flight: deque[int] = field(default_factory=deque)  # task ids, in send order
    assigned_count: int = 0                                # tasks sent to this process
    escalation: Escalation | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class Timeouts:
    """Grace periods of the stop escalation, in seconds."""
    stop: float = 3.0       # after the task pipe is closed, before SIGTERM
    terminate: float = 2.0  # after SIGTERM, before SIGKILL
    kill: float = 5.0       # after SIGKILL, before reporting the process as unreaped


# A worker that dies before READY this many times in a row, with no task completed in
# between, means the initializer (or the worker's start-up) is broken: stop respawning.
MAX_START_FAILURES = 3


class StateMachine:
    """Events in, actions out. See the module docstring for the guarantees."""

    def __init__(self, max_workers: int, clock: Callable[[], float], *,
                 max_tasks_per_child: int | None = None, pipeline_depth: int = 1,
                 timeouts: Timeouts = Timeouts()) -> None:
        assert max_workers >= 1 and pipeline_depth >= 1
        self._clock = clock
        self.slots = [Slot(i) for i in range(max_workers)]
        self.phase = Phase.OPEN
        self.broken = False
        self.start_failures = 0
        self._tasks: dict[int, _Task] = {}
        self._queue: deque[int] = deque()
        self._max_tasks = max_tasks_per_child
        self._depth = pipeline_depth
        self._timeouts = timeouts

    # -- queries ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    def task_state(self, task_id: int) -> TaskState | None:
        """The state of a task still in flight or queued; None once it has ended."""
        task = self._tasks.get(task_id)
        return task.state if task else None

    @property
    def queued(self) -> list[int]:
        return list(self._queue)

    def next_deadline(self) -> float | None:
        deadlines = [s.deadline for s in self.slots if s.deadline is not None]
        return min(deadlines, default=None)

    # -- transitions ------------------------------------------------------------------------

    def _move_task(self, task: _Task, new: TaskState) -> None:
        if new not in TASK_TRANSITIONS[task.state]:
            raise InvalidTransition(f"task {task.task_id}: {task.state.name} -> {new.name}")
        task.state = new
        if new in (TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED):
            del self._tasks[task.task_id]

    def _move_slot(self, slot: Slot, new: SlotState) -> None:
        if new not in SLOT_TRANSITIONS[slot.state]:
            raise InvalidTransition(f"slot {slot.index}: {slot.state.name} -> {new.name}")
        slot.state = new
        if new is not SlotState.STOPPING:
            slot.escalation = slot.deadline = None

    # -- events -----------------------------------------------------------------------------

    def submit(self, task_id: int, *, pipelinable: bool = False) -> list[Action]:
        if self.phase is not Phase.OPEN:
            raise InvalidTransition(f"submit while {self.phase.name}")
        if task_id in self._tasks:
            raise InvalidTransition(f"task {task_id} submitted twice")
        task = _Task(task_id, pipelinable)
        self._tasks[task_id] = task
        if self.broken:
            self._move_task(task, TaskState.FAILED)
            return [FailBroken(task_id)]
        self._queue.append(task_id)
        return self._schedule()

    def worker_ready(self, index: int) -> list[Action]:
        slot = self.slots[index]
        if slot.state is SlotState.STOPPING:
            return []  # stopped while starting; it will exit at end of file
        self._move_slot(slot, SlotState.READY)
        return self._schedule()

    def task_replied(self, index: int, task_id: int) -> list[Action]:
        """A reply arrived. Raises InvalidTransition if it is not for the running task."""
        slot = self.slots[index]
        if not slot.in_flight or slot.in_flight[0] != task_id:
            raise InvalidTransition(
                f"slot {index} replied for task {task_id}, running {list(slot.in_flight)[:1]}")
        slot.in_flight.popleft()
        self._move_task(self._tasks[task_id], TaskState.DONE)
        self.start_failures = 0
        if slot.in_flight:
            self._move_task(self._tasks[slot.in_flight[0]], TaskState.RUNNING)
        actions: list[Action] = [Resolve(task_id)]
        if slot.state is SlotState.READY and self._quota_used(slot):
            self._move_slot(slot, SlotState.RETIRING)
        return actions + self._schedule()

    def task_cancelled(self, index: int, task_id: int) -> list[Action]:
        """A task the machine said to send was found cancelled; it was not sent."""
        slot = self._withdraw(index, task_id)
        self._move_task(self._tasks[task_id], TaskState.CANCELLED)
        if slot.state is SlotState.RETIRING and not self._quota_used(slot):
            self._move_slot(slot, SlotState.READY)
        return self._schedule()

    def send_failed(self, index: int, task_id: int) -> list[Action]:
        """Writing the task to its worker failed: the worker never got it, and is broken.

        The task goes back to the front of the queue; the worker is killed (its exit,
        handled later, fails whatever it had already received and was running).
        """
        slot = self._withdraw(index, task_id)
        self._move_task(self._tasks[task_id], TaskState.QUEUED)
        self._queue.appendleft(task_id)
        return [self._kill(slot)] + self._schedule()

    def _withdraw(self, index: int, task_id: int) -> Slot:
        """Take back a task the dispatcher was told to send but did not deliver."""
        slot = self.slots[index]
        if task_id not in slot.in_flight:
            raise InvalidTransition(f"withdrawing task {task_id}, not sent to slot {index}")
        was_running = slot.in_flight[0] == task_id
        slot.in_flight.remove(task_id)
        slot.assigned_count -= 1
        if was_running and slot.in_flight:
            self._move_task(self._tasks[slot.in_flight[0]], TaskState.RUNNING)
        return slot

    def worker_misbehaved(self, index: int) -> list[Action]:
        """The worker sent garbage: fail its running task, requeue the rest, kill it."""
        slot = self.slots[index]
        actions: list[Action] = []
        if slot.in_flight:
            running = slot.in_flight.popleft()
            self._move_task(self._tasks[running], TaskState.FAILED)
            actions.append(FailMisbehaved(running, index))
        self._requeue_in_flight(slot)
        actions.append(self._kill(slot))
        return actions + self._schedule()

    def spawn_failed(self, index: int) -> list[Action]:
        """Starting the process raised in the parent: counts as a failed start."""
        return self.worker_exited(index)

    def worker_exited(self, index: int, *, unstarted: int = 0) -> list[Action]:
        """The slot's process is gone (and its last replies were already delivered).

        ``unstarted``: how many of the last tasks sent to it were still (partly) unread in
        its pipe, so certainly never started: they are requeued, even the first.
        """
        slot = self.slots[index]
        actions: list[Action] = []
        if slot.state is SlotState.STARTING:
            self.start_failures += 1
        if slot.in_flight and unstarted < len(slot.in_flight):
            running = slot.in_flight.popleft()
            self._move_task(self._tasks[running], TaskState.FAILED)
            actions.append(FailDied(running, index))
        self._requeue_in_flight(slot)
        self._move_slot(slot, SlotState.EMPTY)
        slot.assigned_count = 0
        if not self.broken and self.start_failures >= MAX_START_FAILURES:
            actions += self._break()
        return actions + self._schedule()

    def shutdown(self, *, cancel_futures: bool) -> list[Action]:
        actions: list[Action] = []
        if self.phase is Phase.OPEN:
            self.phase = Phase.DRAINING
        if cancel_futures:
            while self._queue:
                task_id = self._queue.popleft()
                self._move_task(self._tasks[task_id], TaskState.CANCELLED)
                actions.append(Cancel(task_id))
        return actions + self._schedule()

    def tick(self) -> list[Action]:
        """Fire the escalation deadlines that have passed."""
        now = self._clock()
        actions: list[Action] = []
        steps = {Escalation.ASKED: (Escalation.TERMINATED, signal.SIGTERM, self._timeouts.terminate),
                 Escalation.TERMINATED: (Escalation.KILLED, signal.SIGKILL, self._timeouts.kill)}
        for slot in self.slots:
            if slot.deadline is None or slot.deadline > now:
                continue
            assert slot.state is SlotState.STOPPING and slot.escalation is not None
            if slot.escalation in steps:
                slot.escalation, signum, grace = steps[slot.escalation]
                slot.deadline = now + grace
                actions.append(Signal(slot.index, signum))
            else:
                slot.escalation, slot.deadline = Escalation.GIVEN_UP, None
                actions.append(Unreaped(slot.index))
        return actions

    # -- internals ----------------------------------------------------------------------------

    def _quota_used(self, slot: Slot) -> bool:
        return self._max_tasks is not None and slot.assigned_count >= self._max_tasks

    def _requeue_in_flight(self, slot: Slot) -> None:
        # Received by the worker but never started: safe to run elsewhere, ahead of the
        # queue so that they keep their place.
        for task_id in reversed(slot.in_flight):
            self._move_task(self._tasks[task_id], TaskState.QUEUED)
            self._queue.appendleft(task_id)
        slot.in_flight.clear()

    def _break(self) -> list[Action]:
        self.broken = True
        actions: list[Action] = [Broken()]
        while self._queue:
            task_id = self._queue.popleft()
            self._move_task(self._tasks[task_id], TaskState.FAILED)
            actions.append(FailBroken(task_id))
        return actions

    def _schedule(self) -> list[Action]:
        """Assign queued tasks, start or refill workers, stop idle ones when draining."""
        actions = self._assign()
        actions += self._spawn()
        actions += self._stop_idle()
        return actions

    def _assign(self) -> list[Action]:
        actions: list[Action] = []
        while self._queue:
            slot = self._pick_slot(self._tasks[self._queue[0]].pipelinable)
            if slot is None:
                break
            task = self._tasks[self._queue.popleft()]
            self._move_task(task, TaskState.ASSIGNED if slot.in_flight else TaskState.RUNNING)
            slot.in_flight.append(task.task_id)
            slot.assigned_count += 1
            if self._quota_used(slot):
                self._move_slot(slot, SlotState.RETIRING)
            actions.append(Send(slot.index, task.task_id))
        return actions

    def _pick_slot(self, pipelinable: bool) -> Slot | None:
        ready = [s for s in self.slots if s.state is SlotState.READY]
        idle = [s for s in ready if not s.in_flight]
        if idle:
            return idle[0]
        if not pipelinable:
            return None
        open_ = [s for s in ready if len(s.in_flight) < self._depth]
        return min(open_, key=lambda s: len(s.in_flight), default=None)

    def _spawn(self) -> list[Action]:
        if self.broken:
            return []
        actions: list[Action] = []
        if self.phase is Phase.OPEN:
            # Refill: a slot that ran a worker gets a new one, work or not.
            for slot in self.slots:
                if slot.state is SlotState.EMPTY:
                    self._move_slot(slot, SlotState.STARTING)
                    actions.append(Spawn(slot.index))
        # On demand: start workers while queued tasks outnumber the places to run them.
        capacity = sum(1 for s in self.slots if s.state is SlotState.STARTING or
                       (s.state is SlotState.READY and not s.in_flight))
        for slot in self.slots:
            if len(self._queue) <= capacity:
                break
            if slot.state in (SlotState.UNUSED, SlotState.EMPTY):
                self._move_slot(slot, SlotState.STARTING)
                actions.append(Spawn(slot.index))
                capacity += 1
        return actions

    def _stop_idle(self) -> list[Action]:
        """Stop retired workers; when draining, also every worker with nothing left to do."""
        actions: list[Action] = []
        draining = self.phase is Phase.DRAINING and not self._queue
        for slot in self.slots:
            idle = not slot.in_flight
            if slot.state is SlotState.RETIRING and idle:
                actions.append(self._ask_to_stop(slot))
            elif draining and slot.state is SlotState.READY and idle:
                actions.append(self._ask_to_stop(slot))
            elif draining and slot.state is SlotState.STARTING:
                # Not needed any more; it exits at end of file once its initializer is done.
                actions.append(self._ask_to_stop(slot))
        if self.phase is not Phase.DRAINING:
            return actions
        if (not self._queue and not self._tasks and
                all(s.state in (SlotState.UNUSED, SlotState.EMPTY) for s in self.slots)):
            self.phase = Phase.CLOSED
        return actions

    def _kill(self, slot: Slot) -> Signal:
        """SIGKILL the slot's worker now; its exit is expected within the kill grace."""
        if slot.state is not SlotState.STOPPING:
            self._move_slot(slot, SlotState.STOPPING)
        slot.escalation = Escalation.KILLED
        slot.deadline = self._clock() + self._timeouts.kill
        return Signal(slot.index, signal.SIGKILL)

    def _ask_to_stop(self, slot: Slot) -> Stop:
        self._move_slot(slot, SlotState.STOPPING)
        slot.escalation = Escalation.ASKED
        slot.deadline = self._clock() + self._timeouts.stop
        return Stop(slot.index)

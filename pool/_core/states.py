"""The states a task, a slot and the pool can be in, their legal moves, and the records.

Owns: the state enums (a task's, a slot's and the pool's life; how far a worker's ending
has gone, and why), their transition tables, the grace periods of the escalation, and the
records of one task and one slot.
Runs in: the dispatcher thread, through ``StateMachine``.
Guarantees: every state is named here and every legal move is in a table;
``records.Records`` refuses any other move with ``InvalidTransition``.
Assumes: only ``records.Records`` changes a state.
"""

from __future__ import annotations

import enum
from collections import deque
from .values import field, value_type


class InvalidTransition(RuntimeError):
    """An event arrived that the current state cannot accept: a bug in the pool."""


class TaskState(enum.Enum):
    # Members are singletons, so hashing by identity is right. It also runs no Python
    # code, and the machine looks its tables up several times a task.
    __hash__ = object.__hash__

    QUEUED = "queued"        # waiting in the pool's queue
    ASSIGNED = "assigned"    # sent to a worker, behind the task that worker is running
    RUNNING = "running"      # the first task in flight on its worker
    DONE = "done"            # a reply arrived
    FAILED = "failed"        # its worker died, misbehaved, timed out or was terminated
    CANCELLED = "cancelled"  # cancelled before it started, or stopped while running


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.QUEUED: frozenset({TaskState.ASSIGNED, TaskState.RUNNING, TaskState.CANCELLED,
                                 TaskState.FAILED}),
    TaskState.ASSIGNED: frozenset({TaskState.RUNNING, TaskState.QUEUED, TaskState.CANCELLED}),
    # RUNNING -> QUEUED only when the write to the worker failed, or the worker died before
    # reading all of it: either way it never started.
    TaskState.RUNNING: frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED,
                                  TaskState.QUEUED}),
    TaskState.DONE: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}

TASK_ENDS = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED})


class SlotState(enum.Enum):
    __hash__ = object.__hash__  # as TaskState's

    UNUSED = "unused"      # never started; started on demand
    STARTING = "starting"  # process started, READY not yet received
    READY = "ready"        # takes tasks
    RETIRING = "retiring"  # takes no more tasks; stopped once its in-flight tasks are done
    STOPPING = "stopping"  # being ended; escalation deadlines run until it exits
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

# A slot whose worker is up and not being ended: its running task's clock runs.
WORKING = (SlotState.READY, SlotState.RETIRING)


class PoolLife(enum.Enum):
    """The pool's own life, as the state machine leads it (one state, no flags)."""

    __hash__ = object.__hash__  # as TaskState's

    OPEN = "open"                # takes tasks; a slot that empties is refilled
    BROKEN = "broken"            # workers keep failing to start: no worker is started again,
                                 # what is queued fails, and so does what is queued later
                                 # unless a READY worker takes it; what was sent runs, idle
                                 # workers are stopped, then the pool closes
    DRAINING = "draining"        # shutdown: what was submitted runs, and workers are started
                                 # for it; then every worker is asked to stop
    TERMINATING = "terminating"  # terminate/kill_workers: what has not started is cancelled,
                                 # every worker is ended now, nothing is started again
    CLOSED = "closed"            # every task ended and every worker gone: the loop may end


LIFE_TRANSITIONS: dict[PoolLife, frozenset[PoolLife]] = {
    PoolLife.OPEN: frozenset({PoolLife.BROKEN, PoolLife.DRAINING, PoolLife.TERMINATING}),
    # DRAINING -> BROKEN when the workers started for what is left keep failing to start.
    PoolLife.DRAINING: frozenset({PoolLife.BROKEN, PoolLife.TERMINATING, PoolLife.CLOSED}),
    # A broken pool is already draining: shutdown() leaves it BROKEN.
    PoolLife.BROKEN: frozenset({PoolLife.TERMINATING, PoolLife.CLOSED}),
    # Nothing is started while terminating, so no start can fail: it never breaks.
    PoolLife.TERMINATING: frozenset({PoolLife.CLOSED}),
    PoolLife.CLOSED: frozenset(),
}


class Escalation(enum.Enum):
    """How hard a STOPPING slot has been asked to exit. ``escalation.STEPS`` says what each
    step does, how long it is given and what comes next."""

    ASKED = "asked"            # its task pipe was closed: an idle worker exits at end of file
    DUMPING = "dumping"        # its task timed out: asked to write its stack, then it exits
    TERMINATED = "terminated"  # SIGTERM sent to it and its process group
    KILLED = "killed"          # SIGKILL sent to it and its process group
    GIVEN_UP = "given up"      # still not gone after SIGKILL's grace: reported, not assumed


class Ending(enum.Enum):
    """Why the pool is ending a worker that runs a task; decides how that task ends."""

    TIMED_OUT = "timed out"    # the task overran its timeout: it fails with TaskTimeout
    STOPPED = "stopped"        # the caller stopped it: its future ends cancelled
    TERMINATED = "terminated"  # terminate_workers() / kill_workers(): WorkerTerminated


@value_type(frozen=True)
class Timeouts:
    """Grace periods of the escalation, in seconds."""
    stop: float = 3.0       # an idle worker asked to stop (task pipe closed), before SIGTERM
    terminate: float = 0.5  # after SIGTERM, before SIGKILL
    kill: float = 5.0       # after SIGKILL, before reporting the process as unreaped
    dump: float = 1.0       # a timed-out worker asked for its stack, before SIGKILL


@value_type()
class Task:
    task_id: int
    frame_bytes: int                # its CALL frame, header included: what it costs a pipe
    pipelinable: bool               # small enough to be sent ahead, behind a running task
    timeout: float | None = None
    state: TaskState = TaskState.QUEUED
    deadline: float | None = None   # set when it starts RUNNING, if it has a timeout
    started: float | None = None    # when it started RUNNING, as the parent saw it
    stop_requested: bool = False    # stop it as soon as it starts running
    # These two hold for one run; a task taken back from a pipe is checked anew.
    kept_alone: bool = False        # running long: the tasks behind it were taken back, and
                                    # no more are queued behind it
    read_checked: bool = False      # running long: checked that its worker began to read it


@value_type()
class WorkerLife:
    """What the pool knows of the worker in a slot. A slot that empties gets a fresh one,
    so that nothing of a gone worker carries over to the next."""
    pipelining: bool = False        # its pipe can hold small tasks behind the running one
    assigned_count: int = 0         # tasks sent to it
    over_memory: bool = False       # retiring because it reported too much memory
    last_duration: float | None = None  # how long its last task ran
    idle_since: float | None = None     # when it last became READY with nothing in flight
    # It did not read the task it was sent (stopped by SIGSTOP, a debugger, a cgroup
    # freezer): nothing is sent to it before ``stalled_until``; ``stalls`` in a row.
    stalled_until: float | None = None
    stalls: int = 0
    checking_read: bool = False     # a Reclaim is out to see whether it read its task


@value_type()
class Stopping:
    """How far the pool has gone in ending a slot's worker, and why: a slot has one from
    the moment it is STOPPING until it is EMPTY."""
    escalation: Escalation
    deadline: float | None          # when the step's grace runs out; None once given up
    ending: Ending | None = None    # set while a task runs there: decides how that task ends


@value_type()
class Slot:
    index: int
    state: SlotState = SlotState.UNUSED
    in_flight: deque[int] = field(default_factory=deque)  # task ids, in send order
    worker: WorkerLife = field(default_factory=WorkerLife)
    stopping: Stopping | None = None  # while STOPPING only
    # Its last worker was stopped for idling: the slot is refilled only when queued work
    # needs it. Cleared when it starts a worker again.
    idled_out: bool = False

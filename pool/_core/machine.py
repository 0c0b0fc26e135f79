"""The slot/task state machine: which task runs where, and what to do when anything happens.

Owns: the queue of waiting tasks, each slot's state and in-flight tasks, the pool's life
(``PoolLife``: open, broken, draining, terminating, closed), start-failure accounting, task
deadlines and the stop-escalation deadlines.
Runs in: the dispatcher thread only. It performs no I/O: events come in as method calls and
leave as a list of actions for the dispatcher to carry out; time comes from the ``clock`` it
is given (``time.monotonic`` in the pool, a fake one in tests). It imports neither
``threading`` nor ``multiprocessing`` and is unit-tested by feeding it events.
Guarantees:
- a task is sent to a worker once; a worker's tasks are run in the order they were sent, so
  the first in flight is the one running (RUNNING) and the rest are waiting (ASSIGNED);
- when a worker exits, only its RUNNING task ends; how it ends follows the slot's
  ``Ending`` (none: it died; timed out, stopped, terminated). Its ASSIGNED tasks go back
  to the front of the queue (they never started), or are cancelled when terminating;
- a task's timeout counts from the moment it becomes RUNNING; when it passes, its worker is
  asked for its stack and then killed, and escalation continues until the process is gone
  or given up on;
- a small task (one packet) whose worker has not begun to read it
  ``UNREAD_AFTER_SECONDS`` after it was sent (the worker is stopped) is taken back and run
  elsewhere; that worker is sent nothing for a while that doubles each time in a row;
- a start the system refuses for want of a resource is tried again later, with back-off;
  it never breaks the pool (``spawn_refused``);
- with an ``idle_timeout``, a READY worker with nothing in flight for that long is asked to
  stop, and its slot is refilled only when queued work needs it (not at once);
- every task ends in exactly one of DONE, FAILED or CANCELLED, and every slot ends EMPTY
  or UNUSED before the machine reports ``closed``;
- the pool's life moves only as ``LIFE_TRANSITIONS`` allows: after ``MAX_START_FAILURES``
  failed starts in a row it is BROKEN. Then what waits in the queue fails (``Fail``, ``BROKEN``),
  and so does every task submitted later; tasks already sent run on the workers that did
  start, and a task that goes back to the queue (taken back from a pipe, or never started
  by a worker that died) waits only while a READY worker is left to take it, else it fails
  too. Nothing is started, idle workers are stopped, and once nothing runs the broken pool
  closes by itself: nothing waits for a worker that will never come;
- it is the only authority on the protocol: a worker's frame out of turn (a reply for a
  task it is not running, a READY once ready) is the worker misbehaving, answered like
  garbage on the wire (``Misbehaved``, its running task fails ``MISBEHAVED``, a kill); an
  exit first says how the worker left (``WorkerGone``: asked, at start, idle, running), and
  which of its tasks never started follows from each task's frame size, told once at submit;
- an impossible transition raises ``InvalidTransition`` at once (an internal error: the
  pool's own bug, never a worker's).
"""

from __future__ import annotations

import collections
import signal
from collections import deque
from typing import Callable

from .actions import (Action, AskToExit, Broken, Cancel, Departure, DumpStack, Fail,
                      FailCause, Misbehaved, Reclaim, Resolve, Send, Signal, Spawn, Stopped,
                      Unreaped, WorkerGone)
from .states import (LIFE_TRANSITIONS, SLOT_TRANSITIONS, TASK_TRANSITIONS, Ending,
                     Escalation, InvalidTransition, PoolLife, Slot, SlotState, Task,
                     TaskQueue, TaskState, Timeouts)

__all__ = ["StateMachine", "MAX_START_FAILURES", "MAX_REFUSED_STARTS", "RECLAIM_AFTER_SECONDS",
           "SHORT_TASK_SECONDS", "START_RETRY_FIRST_SECONDS", "START_RETRY_MAX_SECONDS",
           "STALL_FIRST_SECONDS", "STALL_MAX_SECONDS", "UNREAD_AFTER_SECONDS"]

# Small tasks are queued behind the running one on a worker (so that it never waits for the
# round trip) only while that worker's last task ran shorter than this.
SHORT_TASK_SECONDS = 0.001

# A task that turns out long does not hold up the small ones queued behind it: once it has
# run this long, they are taken back from its worker's pipe and run elsewhere.
RECLAIM_AFTER_SECONDS = 0.005

# A worker that has not begun to read the task it was sent this long after it was sent is
# not reading (stopped by SIGSTOP, a debugger or a cgroup freezer): the task is taken back
# from its pipe, unread, and run elsewhere, and the worker is sent nothing for a while,
# STALL_FIRST_SECONDS the first time, twice as long each time in a row, up to
# STALL_MAX_SECONDS. (Only where pipes can give frames back: ``Slot.pipelining``.)
UNREAD_AFTER_SECONDS = 1.0
STALL_FIRST_SECONDS = 1.0
STALL_MAX_SECONDS = 30.0

# A worker that dies before READY this many times in a row, with no task completed in
# between, means the initializer (or the worker's start-up) is broken: stop respawning.
MAX_START_FAILURES = 3

# A start the system refuses (no descriptor, process or memory to spare) says nothing about
# the workers: it is retried, the first time after START_RETRY_FIRST_SECONDS, then after
# twice as long each time, up to START_RETRY_MAX_SECONDS between tries, for as long as the
# pool is open. Once MAX_REFUSED_STARTS starts in a row were refused (about 1.3 s) and no
# worker is left to run what is queued, the queued tasks fail (``REFUSED``) rather than
# wait for a resource that may not come back; tasks submitted later wait for the next try.
START_RETRY_FIRST_SECONDS = 0.01
START_RETRY_MAX_SECONDS = 2.0
MAX_REFUSED_STARTS = 8

_ENDS = (TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED)
# Slots whose running task's clock runs (a slot being ended has its own deadlines).
_RUNNING_STATES = (SlotState.READY, SlotState.RETIRING)

# When a step's grace period runs out, the next step (the last one reports the process).
_NEXT_STEP = {Escalation.ASKED: Escalation.TERMINATED, Escalation.DUMPING: Escalation.KILLED,
              Escalation.TERMINATED: Escalation.KILLED, Escalation.KILLED: Escalation.GIVEN_UP}


def _doubling(first: float, nth: int, most: float) -> float:
    """A back-off: ``first`` for the first time in a row, twice as long each time after,
    never more than ``most`` (the exponent is capped: a float power would overflow)."""
    return min(first * float(2 ** min(nth - 1, 30)), most)


def _stalled(slot: Slot, now: float) -> bool:
    """The slot's worker did not read what it was sent, and its wait is not over."""
    return slot.stalled_until is not None and slot.stalled_until > now


class StateMachine:
    """Events in, actions out. See the module docstring for the guarantees."""

    def __init__(self, max_workers: int, clock: Callable[[], float], *,
                 max_tasks_per_child: int | None = None, pipeline_depth: int = 1,
                 pipeline_max_frame: int = 4096, timeouts: Timeouts = Timeouts(),
                 idle_timeout: float | None = None) -> None:
        """``pipeline_max_frame``: the largest frame (header included) that may be sent
        ahead, behind a running task (``_limits.PIPELINE_MAX_FRAME`` in the pool)."""
        assert max_workers >= 1 and pipeline_depth >= 1 and pipeline_max_frame > 0
        assert idle_timeout is None or idle_timeout > 0
        self._clock = clock
        self.slots = [Slot(i) for i in range(max_workers)]
        self.life = PoolLife.OPEN
        self.start_failures = 0
        self.refused_starts = 0  # starts refused in a row (reset by a worker that is READY)
        self._start_retry_at: float | None = None  # no start before then (after a refusal)
        self._tasks: dict[int, Task] = {}
        self._queue = TaskQueue(self._tasks)
        self._max_tasks = max_tasks_per_child
        self._depth = pipeline_depth
        self._ahead_max_frame = pipeline_max_frame
        self._timeouts = timeouts
        self._idle_timeout = idle_timeout
        # How many slots are in each state: lets _schedule, which runs on every event,
        # skip its passes over the slots when they cannot do anything.
        # (Every state present from the start: a missing key costs a Python __missing__
        # call, and these are read on every event.)
        self._in_state = collections.Counter({state: 0 for state in SlotState})
        self._in_state[SlotState.UNUSED] = max_workers

    # -- queries ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.life is PoolLife.CLOSED

    def task_state(self, task_id: int) -> TaskState | None:
        """The state of a task still in flight or queued; None once it has ended."""
        task = self._tasks.get(task_id)
        return task.state if task else None

    @property
    def queued(self) -> list[int]:
        return list(self._queue)

    def started_at(self, task_id: int) -> float | None:
        """When a task started RUNNING (the machine's clock); None if it has not, or ended."""
        task = self._tasks.get(task_id)
        return None if task is None or task.state is not TaskState.RUNNING else task.started

    def running_task(self, index: int) -> int | None:
        """The task the slot's worker is running (the first sent to it), if any."""
        in_flight = self.slots[index].in_flight
        return in_flight[0] if in_flight else None

    def running_count(self) -> int:
        """How many slots are running a task."""
        return sum(1 for slot in self.slots if slot.in_flight)

    def census(self) -> tuple[int, int]:
        """``(queued, sent)``: tasks waiting for a worker, and tasks a worker holds."""
        return len(self._queue), sum(len(slot.in_flight) for slot in self.slots)

    def next_deadline(self) -> float | None:
        """The earliest time ``tick`` has something to do: an escalation step, a task
        timeout, taking back the tasks behind a long one, or trying a refused start again.
        (One pass: runs every turn.)"""
        deadlines = [] if self._start_retry_at is None else [self._start_retry_at]
        for slot in self.slots:
            if slot.deadline is not None:
                deadlines.append(slot.deadline)
            if slot.stalled_until is not None:
                deadlines.append(slot.stalled_until)
            if self._idle_timeout is not None:
                idle_at = self._idle_deadline(slot)
                if idle_at is not None:
                    deadlines.append(idle_at)
            if not slot.in_flight or slot.state not in _RUNNING_STATES:
                continue
            head = self._tasks[slot.in_flight[0]]
            if head.deadline is not None:
                deadlines.append(head.deadline)
            reclaim_at = self._reclaim_deadline(slot, head)
            if reclaim_at is not None:
                deadlines.append(reclaim_at)
            unread_at = self._unread_deadline(slot, head)
            if unread_at is not None:
                deadlines.append(unread_at)
        return min(deadlines, default=None)

    # -- transitions ------------------------------------------------------------------------

    def _move_task(self, task: Task, new: TaskState) -> None:
        if new not in TASK_TRANSITIONS[task.state]:
            raise InvalidTransition(f"task {task.task_id}: {task.state.name} -> {new.name}")
        task.state = new
        if new in _ENDS:
            del self._tasks[task.task_id]
        elif new is not TaskState.RUNNING:
            task.deadline = None

    def _move_life(self, new: PoolLife) -> None:
        if new not in LIFE_TRANSITIONS[self.life]:
            raise InvalidTransition(f"pool: {self.life.name} -> {new.name}")
        self.life = new

    def _move_slot(self, slot: Slot, new: SlotState) -> None:
        if new not in SLOT_TRANSITIONS[slot.state]:
            raise InvalidTransition(f"slot {slot.index}: {slot.state.name} -> {new.name}")
        self._in_state[slot.state] -= 1
        self._in_state[new] += 1
        slot.state = new
        if new is SlotState.STARTING:
            slot.idled_out = False
        elif new is SlotState.READY and not slot.in_flight:
            slot.idle_since = self._clock()
        if new is not SlotState.STOPPING:
            slot.escalation = slot.deadline = slot.ending = None
        if new is SlotState.EMPTY:
            slot.assigned_count, slot.over_memory, slot.last_duration = 0, False, None
            slot.stalled_until, slot.stalls, slot.checking_read = None, 0, False

    def _start_running(self, slot: Slot, task: Task, now: float | None = None) -> list[Action]:
        """``task`` is now the one its worker runs: start its clock (or stop it at once).
        ``now``: the machine's clock, if the caller has just read it."""
        self._move_task(task, TaskState.RUNNING)
        task.started = started = self._clock() if now is None else now
        if task.stop_requested:
            return self._stop_running(slot)
        if task.timeout is not None:
            task.deadline = started + task.timeout
        return []

    # -- events -----------------------------------------------------------------------------

    def submit(self, task_id: int, *, frame_bytes: int, timeout: float | None = None,
               schedule: bool = True) -> list[Action]:
        """A new task whose CALL frame is ``frame_bytes`` long (header included): that
        decides whether it may be sent ahead, behind a running task, and how much of a dead
        worker's pipe it fills. ``schedule=False`` only queues it, for a burst of
        submissions that ends with one ``schedule()`` (sending them task by task would cost
        a pass over the slots for each)."""
        life = self.life
        if life is not PoolLife.OPEN and life is not PoolLife.BROKEN:
            raise InvalidTransition(f"submit while {life.name}")
        if task_id in self._tasks:
            raise InvalidTransition(f"task {task_id} submitted twice")
        task = Task(task_id, frame_bytes, frame_bytes <= self._ahead_max_frame, timeout)
        self._tasks[task_id] = task
        if life is PoolLife.BROKEN:  # (submitted before the caller could know)
            self._move_task(task, TaskState.FAILED)
            return [Fail(task_id, FailCause.BROKEN)]
        self._queue.append(task_id)
        return self._schedule() if schedule else []

    def schedule(self) -> list[Action]:
        """Assign what is queued and start workers as needed (after ``submit(schedule=False)``)."""
        return self._schedule()

    def worker_ready(self, index: int, *, pipelining: bool = True) -> list[Action]:
        """The worker is up. ``pipelining``: its pipe can hold tasks queued behind the
        running one, and give them back (``Reclaim``). A second READY, from a worker that
        is already ready, is the worker misbehaving."""
        slot = self.slots[index]
        if slot.state is SlotState.STOPPING:
            return []  # stopped while starting; it will exit at end of file
        if slot.state in _RUNNING_STATES:  # it said so before
            return self.worker_misbehaved(index, "a READY frame from a worker already ready")
        slot.pipelining = pipelining
        self._move_slot(slot, SlotState.READY)
        self.refused_starts = 0  # the system has room again: the other slots start now
        self._start_retry_at = None
        return self._schedule()

    def worker_init_failed(self, index: int) -> list[Action]:
        """The worker says its initializer failed; it exits next, and that exit is a failed
        start. Only a starting worker may say so: from one already ready, it is the worker
        misbehaving."""
        if self.slots[index].state in _RUNNING_STATES:
            return self.worker_misbehaved(
                index, "an INIT_FAILED frame from a worker already ready")
        return []

    def worker_over_memory(self, index: int) -> list[Action]:
        """The worker reported (before its reply) that it uses more memory than allowed."""
        slot = self.slots[index]
        slot.over_memory = True
        if slot.state is SlotState.READY:
            self._move_slot(slot, SlotState.RETIRING)
        return self._schedule()

    def task_replied(self, index: int, task_id: int, outcome: object = None) -> list[Action]:
        """A reply arrived (``outcome``, opaque here, travels in ``Resolve``). A reply for
        any task but the one running is the worker breaking the protocol."""
        return self.tasks_replied(index, [(task_id, outcome)])

    def tasks_replied(self, index: int, replies: list[tuple[int, object]]) -> list[Action]:
        """Replies that arrived together from one worker, in order, each as
        ``task_replied`` takes it; what is queued is assigned once, after all of them (a
        worker that keeps up sends several per read, and a pass over the slots for each
        would cost more than the reply). A reply out of turn ends the batch: the worker
        misbehaved, and nothing after it is believed."""
        assert replies, "no replies"
        slot = self.slots[index]
        in_flight = slot.in_flight
        tasks = self._tasks
        now = self._clock()  # (they arrived together)
        actions: list[Action] = []
        for task_id, outcome in replies:
            if not in_flight or in_flight[0] != task_id:
                return actions + self.worker_misbehaved(
                    index, f"a reply for task {task_id}, which it was not running")
            in_flight.popleft()
            task = tasks[task_id]
            self._move_task(task, TaskState.DONE)
            slot.stalls = 0
            self.start_failures = 0  # a task completed: the starts before it do not count
            if task.started is not None:
                slot.last_duration = now - task.started
            actions.append(Resolve(task_id, outcome))
            if slot.ending is Ending.TIMED_OUT or slot.ending is Ending.STOPPED:
                # It finished just as it was being ended: its reply wins (a stop still makes
                # its future cancelled); the worker goes anyway.
                slot.ending = None
            if in_flight:
                if more := self._start_running(slot, tasks[in_flight[0]], now):
                    actions += more
            else:
                slot.idle_since = now
            if slot.state is SlotState.READY and self._quota_used(slot):
                self._move_slot(slot, SlotState.RETIRING)
        return actions + self._schedule()

    def send_cancelled(self, index: int, task_id: int) -> list[Action]:
        """A task the machine said to send was found cancelled; it was not sent."""
        slot, actions = self._withdraw(index, task_id)
        self._move_task(self._tasks[task_id], TaskState.CANCELLED)
        if (slot.state is SlotState.RETIRING and not self._quota_used(slot)
                and not slot.over_memory):
            self._move_slot(slot, SlotState.READY)
        return actions + self._schedule()

    def send_failed(self, index: int, task_id: int) -> list[Action]:
        """Writing the task to its worker failed: the worker never got it, and is broken.

        The task goes back to the front of the queue (as any task that never started:
        ``_requeue``); the worker is killed (its exit, handled later, fails whatever it had
        already received and was running).
        """
        slot, actions = self._withdraw(index, task_id)
        actions += self._requeue([task_id])
        return actions + self._kill(slot) + self._schedule()

    def _withdraw(self, index: int, task_id: int) -> tuple[Slot, list[Action]]:
        """Take back a task the dispatcher was told to send but did not deliver."""
        slot = self.slots[index]
        if task_id not in slot.in_flight:
            raise InvalidTransition(f"withdrawing task {task_id}, not sent to slot {index}")
        was_running = slot.in_flight[0] == task_id
        slot.in_flight.remove(task_id)
        slot.assigned_count -= 1
        if not slot.in_flight:
            slot.idle_since = self._clock()
        if was_running and slot.in_flight:
            return slot, self._start_running(slot, self._tasks[slot.in_flight[0]])
        return slot, []

    def worker_misbehaved(self, index: int, reason: str = "") -> list[Action]:
        """The worker sent garbage (``reason`` says what): fail its running task, requeue
        the rest, kill it."""
        slot = self.slots[index]
        actions: list[Action] = [Misbehaved(index, reason)]
        if slot.in_flight:
            running = slot.in_flight.popleft()
            self._move_task(self._tasks[running], TaskState.FAILED)
            actions.append(Fail(running, FailCause.MISBEHAVED, index, reason=reason))
        actions += self._requeue_in_flight(slot)
        return actions + self._kill(slot) + self._schedule()

    def spawn_failed(self, index: int) -> list[Action]:
        """Starting the process raised in the parent: counts as a failed start.

        This and ``spawn_refused`` may come for a slot already asked to stop (STOPPING):
        the actions of one event can start several slots, and the failure of the first can
        wind the pool down and ask the others to stop before their starts are tried. An
        ``AskToExit``, ``Signal`` or ``DumpStack`` for a slot whose start then fails names
        no process; the loop skips it."""
        return self._emptied(self.slots[index], 0, None)

    def spawn_refused(self, index: int) -> list[Action]:
        """The system refused to start the slot's process for want of a resource
        (descriptors, processes, memory). Not a failed start (the pool does not break): no
        process is started before a delay that doubles with each round of starts refused in
        a row. Once
        ``MAX_REFUSED_STARTS`` were refused and no worker is left to take what is queued,
        the queued tasks fail ``REFUSED``."""
        slot = self.slots[index]
        self._move_slot(slot, SlotState.EMPTY)  # (refilled like any empty slot, when tried)
        if self._start_retry_at is None:  # the first refusal of this round of starts
            self.refused_starts += 1
            self._start_retry_at = self._clock() + _doubling(
                START_RETRY_FIRST_SECONDS, self.refused_starts, START_RETRY_MAX_SECONDS)
        actions: list[Action] = []
        if self.refused_starts >= MAX_REFUSED_STARTS and not self._could_take_queued():
            actions = self._fail_queue(FailCause.REFUSED)
        return actions + self._schedule()

    def _could_take_queued(self) -> bool:
        """Some worker runs, or is starting, that can take queued tasks."""
        return any(self._in_state[state] for state in
                   (SlotState.STARTING, SlotState.READY, SlotState.RETIRING))

    def worker_exited(self, index: int, *, unread_bytes: int = 0, exited: object = None,
                      lost_track: bool = False) -> list[Action]:
        """The slot's process is gone (and its last replies were already delivered), or it
        was given up on after SIGKILL's grace. ``exited`` (opaque here) is what is known of
        it; it travels in the actions that report it.

        ``unread_bytes``: how much of what was written to its task pipe it never read. The
        last tasks sent whose frames lie wholly in those bytes certainly never started:
        they are requeued, even the first. A frame read in part counts as started: a worker
        unpickles a large call as it reads it, so user code (reducers) may have run, perhaps
        the code that killed it; sent again, it would kill worker after worker.

        ``lost_track``: the pool ended it because it could no longer watch it (its
        forkserver exited): if it was starting, that says nothing of its start, which does
        not count as failed.
        """
        slot = self.slots[index]
        if slot.state is SlotState.STOPPING:
            departure = Departure.ASKED
        elif slot.state is SlotState.STARTING:
            departure = Departure.AT_START
        else:
            departure = Departure.RUNNING if slot.in_flight else Departure.IDLE
        gone: list[Action] = [WorkerGone(index, departure, exited)]
        return gone + self._emptied(slot, unread_bytes, exited, failed_start=not lost_track)

    def _unstarted(self, slot: Slot, unread_bytes: int) -> int:
        """How many of the last tasks sent to the slot lie wholly in its unread bytes."""
        count, later_frames = 0, 0
        for task_id in reversed(slot.in_flight):
            later_frames += self._tasks[task_id].frame_bytes
            if unread_bytes < later_frames:
                break
            count += 1
        return count

    def _emptied(self, slot: Slot, unread_bytes: int, exited: object,
                 failed_start: bool = True) -> list[Action]:
        actions: list[Action] = []
        if slot.state is SlotState.STARTING and failed_start:
            self.start_failures += 1
        if slot.in_flight and self._unstarted(slot, unread_bytes) < len(slot.in_flight):
            actions.append(self._end_running_task(slot, exited))
        actions += self._requeue_in_flight(slot)
        self._move_slot(slot, SlotState.EMPTY)
        if (self.start_failures >= MAX_START_FAILURES
                and PoolLife.BROKEN in LIFE_TRANSITIONS[self.life]):
            actions += self._break()
        return actions + self._schedule()

    def stop_task(self, task_id: int) -> list[Action]:
        """The caller wants this task stopped: cancelled if it has not started, its worker
        killed (and replaced) if it runs. Nothing happens if it has already ended."""
        task = self._tasks.get(task_id)
        if task is None:
            return []
        if task.state is TaskState.QUEUED:
            self._move_task(task, TaskState.CANCELLED)
            self._queue.left()
            return [Stopped(task_id)] + self._schedule()
        if task.state is TaskState.ASSIGNED:
            # Behind another task in its worker's pipe: take it back (if the worker has
            # already read it, it is stopped when it starts).
            task.stop_requested = True
            return [Reclaim(next(s for s in self.slots if task_id in s.in_flight).index)]
        # Running: its worker is killed. If it dies before it has read the call (the frame
        # still wholly in its pipe), the task never started, but it is not sent again:
        # its caller stopped it (``_requeue`` cancels it).
        task.stop_requested = True
        slot = next(s for s in self.slots if s.in_flight and s.in_flight[0] == task_id)
        return self._stop_running(slot)

    def callers_cancelled(self, task_ids: list[int]) -> list[Action]:
        """Their callers cancelled these tasks' futures while they were queued: they leave
        the queue (in O(1) each). Tasks no longer queued are skipped: already sent (found
        cancelled at send time: ``send_cancelled``), ended, or never known."""
        actions: list[Action] = []
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            if task is not None and task.state is TaskState.QUEUED:
                self._move_task(task, TaskState.CANCELLED)
                self._queue.left()
                actions.append(Stopped(task_id))
        return actions + self._schedule() if actions else []

    def shutdown(self, *, cancel_futures: bool) -> list[Action]:
        """Finish what was submitted (or, with ``cancel_futures``, only what was sent),
        then stop every worker and close. A broken or terminating pool already does."""
        actions: list[Action] = []
        if self.life is PoolLife.OPEN:
            self._move_life(PoolLife.DRAINING)
        if cancel_futures:
            while self._queue:
                task_id = self._queue.popleft()
                self._move_task(self._tasks[task_id], TaskState.CANCELLED)
                actions.append(Cancel(task_id))
        return actions + self._schedule()

    def terminate(self, signum: int) -> list[Action]:
        """terminate_workers() (SIGTERM) or kill_workers() (SIGKILL): shut down, cancel
        what has not started, and end every worker now, running tasks included."""
        actions = self.shutdown(cancel_futures=True)
        if self.life not in (PoolLife.TERMINATING, PoolLife.CLOSED):
            self._move_life(PoolLife.TERMINATING)
        for slot in self.slots:
            if slot.state in (SlotState.UNUSED, SlotState.EMPTY):
                continue
            if slot.in_flight and slot.ending is None:
                slot.ending = Ending.TERMINATED
            if signum == signal.SIGKILL:
                actions += self._kill(slot)
            elif slot.escalation in (None, Escalation.ASKED):
                actions.append(self._escalate(slot, Escalation.TERMINATED))
        return actions

    def tasks_reclaimed(self, index: int, task_ids: list[int]) -> list[Action]:
        """These tasks sent to the slot (in send order) were taken back from its pipe
        unread: they go back to the front of the queue (or end, if stopped).

        The worker reads its pipe while they are taken, so it may have got any of them: a
        later one too, while an earlier one was taken back. What it got stays in flight,
        in order; if the task believed running was taken back, the first of those runs.
        """
        slot = self.slots[index]
        checking_read, slot.checking_read = slot.checking_read, False
        if not task_ids:
            return []
        taken = set(task_ids)
        in_flight = list(slot.in_flight)
        if [t for t in in_flight if t in taken] != task_ids:
            raise InvalidTransition(f"slot {index} gave back {task_ids}, "
                                    f"not tasks in flight there {in_flight}")
        head_taken = in_flight[0] in taken
        slot.in_flight = deque(t for t in in_flight if t not in taken)
        if not slot.in_flight:
            slot.idle_since = self._clock()
        slot.assigned_count -= len(task_ids)
        actions = self._requeue(task_ids)
        if head_taken and checking_read:  # sent long ago, and still not read: stalled
            slot.stalls += 1
            slot.stalled_until = self._clock() + _doubling(
                STALL_FIRST_SECONDS, slot.stalls, STALL_MAX_SECONDS)
        if head_taken and slot.in_flight:
            actions += self._start_running(slot, self._tasks[slot.in_flight[0]])
        if (slot.state is SlotState.RETIRING and not self._quota_used(slot)
                and not slot.over_memory):
            self._move_slot(slot, SlotState.READY)
        return actions + self._schedule()

    def tick(self) -> list[Action]:
        """Fire the task deadlines and escalation deadlines that have passed, and take back
        the tasks queued behind one that has run too long."""
        now = self._clock()
        actions: list[Action] = []
        if self._start_retry_at is not None and self._start_retry_at <= now:
            self._start_retry_at = None
            actions += self._spawn()
        for slot, head, deadline in self._heads_with_followers():
            if deadline <= now:
                head.kept_alone = True
                actions.append(Reclaim(slot.index))
        unstalled = False
        for slot, task in self._timed_running():
            unread_at = self._unread_deadline(slot, task)
            if unread_at is not None and unread_at <= now:
                # Has its worker begun to read it? A Reclaim takes it back if not.
                task.read_checked = slot.checking_read = True
                actions.append(Reclaim(slot.index))
            if task.deadline is not None and task.deadline <= now:
                task.deadline = None
                actions.append(self._escalate(slot, Escalation.DUMPING))
                slot.ending = Ending.TIMED_OUT
        for slot in self.slots:
            if slot.stalled_until is not None and slot.stalled_until <= now:
                slot.stalled_until = None  # it may be sent tasks again (and checked again)
                unstalled = True
            idle_at = None if self._idle_timeout is None else self._idle_deadline(slot)
            if idle_at is not None and idle_at <= now:
                slot.idled_out = True
                actions.append(self._ask_to_stop(slot))
            if slot.deadline is None or slot.deadline > now:
                continue
            assert slot.state is SlotState.STOPPING and slot.escalation is not None
            actions.append(self._escalate(slot, _NEXT_STEP[slot.escalation]))
        if unstalled:
            actions += self._schedule()
        return actions

    # -- internals ----------------------------------------------------------------------------

    def _timed_running(self) -> list[tuple[Slot, Task]]:
        """Running tasks whose clock can still run out (their worker is not being ended)."""
        return [(s, self._tasks[s.in_flight[0]]) for s in self.slots
                if s.in_flight and s.state in _RUNNING_STATES]

    def _heads_with_followers(self) -> list[tuple[Slot, Task, float]]:
        """Running tasks with tasks queued behind them that may still be taken back, and
        when that is to be done."""
        heads = []
        for slot, head in self._timed_running():
            reclaim_at = self._reclaim_deadline(slot, head)
            if reclaim_at is not None:
                heads.append((slot, head, reclaim_at))
        return heads

    def _idle_deadline(self, slot: Slot) -> float | None:
        """When the slot's worker has idled long enough to be stopped; None if it never
        does (no ``idle_timeout``, busy, not READY, or the pool is not open)."""
        if (self._idle_timeout is None or slot.state is not SlotState.READY or slot.in_flight
                or self.life is not PoolLife.OPEN or slot.idle_since is None):
            return None
        return slot.idle_since + self._idle_timeout

    @staticmethod
    def _reclaim_deadline(slot: Slot, head: Task) -> float | None:
        """When the tasks queued behind ``head`` (running in ``slot``) are to be taken back;
        None if none are, or that was done already."""
        if len(slot.in_flight) > 1 and not head.kept_alone and head.started is not None:
            return head.started + RECLAIM_AFTER_SECONDS
        return None

    @staticmethod
    def _unread_deadline(slot: Slot, head: Task) -> float | None:
        """When to check that the worker began to read ``head``, the task it runs; None
        if that was done, or cannot be: only a one-packet frame can be taken back whole,
        and only from a pipe with packets."""
        if slot.pipelining and head.pipelinable and not head.read_checked and (
                head.started is not None):
            return head.started + UNREAD_AFTER_SECONDS
        return None

    def _quota_used(self, slot: Slot) -> bool:
        return self._max_tasks is not None and slot.assigned_count >= self._max_tasks

    def _end_running_task(self, slot: Slot, exited: object) -> Action:
        """The slot's worker is gone: its running task ends as the slot's ``ending`` says."""
        task = self._tasks[slot.in_flight.popleft()]
        if slot.ending is Ending.STOPPED:
            self._move_task(task, TaskState.CANCELLED)
            return Stopped(task.task_id, ran=True)
        self._move_task(task, TaskState.FAILED)
        if slot.ending is Ending.TIMED_OUT:
            assert task.timeout is not None
            return Fail(task.task_id, FailCause.TIMED_OUT, slot.index, task.timeout, exited)
        if slot.ending is Ending.TERMINATED:
            return Fail(task.task_id, FailCause.TERMINATED, slot.index, exited=exited)
        return Fail(task.task_id, FailCause.DIED, slot.index, exited=exited)

    def _requeue_in_flight(self, slot: Slot) -> list[Action]:
        task_ids = list(slot.in_flight)
        slot.in_flight.clear()
        return self._requeue(task_ids)

    def _requeue(self, task_ids: list[int]) -> list[Action]:
        """Tasks sent to a worker (in send order) that never started: safe to run elsewhere,
        ahead of the queue so that they keep their place; when terminating, or when their
        caller asked to stop them, they are cancelled instead. (In a broken pool, the queue
        keeps them only while a worker can take them: ``_schedule``.)"""
        actions: list[Action] = []
        for task_id in reversed(task_ids):
            task = self._tasks[task_id]
            if self.life is PoolLife.TERMINATING or task.stop_requested:
                self._move_task(task, TaskState.CANCELLED)
                actions.append(Stopped(task.task_id))
            else:
                self._move_task(task, TaskState.QUEUED)
                task.kept_alone = task.read_checked = False  # (its next run is checked anew)
                self._queue.appendleft(task.task_id)
        return actions

    def _break(self) -> list[Action]:
        """Workers keep failing to start: fail what waits, start nothing more (a broken
        pool ends as a draining one does: ``_stop_idle``)."""
        self._move_life(PoolLife.BROKEN)
        return [Broken()] + self._fail_queue()

    def _fail_queue(self, cause: FailCause = FailCause.BROKEN) -> list[Action]:
        """Fail every queued task for ``cause``: the pool broke, or no worker can start."""
        actions: list[Action] = []
        while self._queue:
            task_id = self._queue.popleft()
            self._move_task(self._tasks[task_id], TaskState.FAILED)
            actions.append(Fail(task_id, cause))
        return actions

    def _schedule(self) -> list[Action]:
        """Assign queued tasks, start or refill workers, stop idle ones when the pool is
        ending. In a broken pool, what is still queued once no READY worker is left to
        take it fails: no worker will come for it."""
        actions = self._assign() if self._queue else []
        if (self.life is PoolLife.BROKEN and self._queue
                and not self._in_state[SlotState.READY]):
            actions += self._fail_queue()
        actions += self._spawn()
        actions += self._stop_idle()
        return actions

    def _assign(self) -> list[Action]:
        actions: list[Action] = []
        queue, tasks = self._queue, self._tasks
        now = self._clock()
        while (task_id := queue.peek()) is not None:
            task = tasks[task_id]
            slot = self._pick_slot(task.pipelinable, now)
            if slot is None:
                break
            queue.drop_head()
            slot.in_flight.append(task_id)
            slot.assigned_count += 1
            if self._quota_used(slot):
                self._move_slot(slot, SlotState.RETIRING)
            actions.append(Send(slot.index, task_id))
            if len(slot.in_flight) == 1:
                actions += self._start_running(slot, task, now)
            else:
                self._move_task(task, TaskState.ASSIGNED)
        return actions

    def _pick_slot(self, pipelinable: bool, now: float) -> Slot | None:
        """An idle READY slot, else (for a small task) the READY slot with the fewest tasks
        in flight, below the pipeline depth, whose last task was short and whose running
        task is small and not running long. (One pass: this runs for every task.)"""
        best: Slot | None = None
        for slot in self.slots:
            if slot.state is not SlotState.READY or _stalled(slot, now):
                continue
            if not slot.in_flight:
                return slot
            if (pipelinable and slot.pipelining and len(slot.in_flight) < self._depth
                    and slot.last_duration is not None
                    and slot.last_duration < SHORT_TASK_SECONDS
                    and (best is None or len(slot.in_flight) < len(best.in_flight))):
                head = self._tasks[slot.in_flight[0]]
                if (head.pipelinable and not head.kept_alone and head.started is not None
                        and now - head.started < RECLAIM_AFTER_SECONDS):
                    best = slot
        return best

    def _spawn(self) -> list[Action]:
        if self.life not in (PoolLife.OPEN, PoolLife.DRAINING):
            return []
        if not (self._in_state[SlotState.EMPTY] or self._in_state[SlotState.UNUSED]):
            return []  # every slot has a process: nothing to start (the common case)
        if self._start_retry_at is not None:
            return []  # the system refused the last start: ``tick`` tries again
        # After refused starts, one start at a time (a probe) until a worker is READY: a
        # hundred empty slots need not each be refused at every try.
        probing = self.refused_starts > 0
        if probing and self._in_state[SlotState.STARTING]:
            return []
        actions: list[Action] = []
        capacity = 0  # places where a queued task could start soon
        now = self._clock()
        for slot in self.slots:
            if (slot.state is SlotState.EMPTY and self.life is PoolLife.OPEN
                    and not slot.idled_out):
                # Refill: a slot that ran a worker gets a new one, work or not (unless it
                # was stopped for idling: then only when work needs it, below).
                self._move_slot(slot, SlotState.STARTING)
                actions.append(Spawn(slot.index))
                if probing:
                    return actions
            if slot.state is SlotState.STARTING or (
                    slot.state is SlotState.READY and not slot.in_flight
                    and not _stalled(slot, now)):
                capacity += 1  # (a stalled worker is none: it does not read what it gets)
        if len(self._queue) <= capacity:
            return actions
        # On demand: start workers while queued tasks outnumber the places to run them.
        for slot in self.slots:
            if len(self._queue) <= capacity:
                break
            if slot.state in (SlotState.UNUSED, SlotState.EMPTY):
                self._move_slot(slot, SlotState.STARTING)
                actions.append(Spawn(slot.index))
                capacity += 1
                if probing:
                    break
        return actions

    def _stop_idle(self) -> list[Action]:
        """Stop retired workers; when the pool is ending (draining, broken or terminating),
        also every worker with nothing left to do, and close once all are gone."""
        actions: list[Action] = []
        open_ = self.life is PoolLife.OPEN
        if open_ and not self._in_state[SlotState.RETIRING]:
            return actions  # the common case, checked cheaply
        winding_down = not open_ and not self._queue
        for slot in self.slots:
            idle = not slot.in_flight
            if slot.state is SlotState.RETIRING and idle:
                actions.append(self._ask_to_stop(slot))
            elif winding_down and slot.state is SlotState.READY and idle:
                actions.append(self._ask_to_stop(slot))
            elif winding_down and slot.state is SlotState.STARTING:
                # Not needed any more; it exits at end of file once its initializer is done.
                actions.append(self._ask_to_stop(slot))
        if open_ or self.life is PoolLife.CLOSED:
            return actions
        if (not self._queue and not self._tasks and
                all(s.state in (SlotState.UNUSED, SlotState.EMPTY) for s in self.slots)):
            self._move_life(PoolLife.CLOSED)
        return actions

    def _stop_running(self, slot: Slot) -> list[Action]:
        """End the worker running a task the caller stopped (unless its timeout already
        fired: then the timeout is what the caller is told)."""
        if slot.ending is Ending.TIMED_OUT:
            return []
        actions = self._kill(slot)
        slot.ending = Ending.STOPPED
        return actions

    def _kill(self, slot: Slot) -> list[Action]:
        """SIGKILL the slot's worker now (unless that was done); its exit is expected
        within the kill grace."""
        if slot.escalation in (Escalation.KILLED, Escalation.GIVEN_UP):
            return []
        return [self._escalate(slot, Escalation.KILLED)]

    def _ask_to_stop(self, slot: Slot) -> Action:
        return self._escalate(slot, Escalation.ASKED)

    def _escalate(self, slot: Slot, step: Escalation) -> Action:
        """Take the slot's worker to ``step`` of ending it: the slot is STOPPING, the step's
        grace period runs (none after giving up), and the step's action is returned."""
        if slot.state is not SlotState.STOPPING:
            self._move_slot(slot, SlotState.STOPPING)
        slot.escalation = step
        grace = {Escalation.ASKED: self._timeouts.stop, Escalation.DUMPING: self._timeouts.dump,
                 Escalation.TERMINATED: self._timeouts.terminate,
                 Escalation.KILLED: self._timeouts.kill}.get(step)
        slot.deadline = None if grace is None else self._clock() + grace
        if step is Escalation.ASKED:
            return AskToExit(slot.index)
        if step is Escalation.DUMPING:
            return DumpStack(slot.index)
        if step is Escalation.TERMINATED:
            return Signal(slot.index, signal.SIGTERM)
        if step is Escalation.KILLED:
            return Signal(slot.index, signal.SIGKILL)
        return Unreaped(slot.index)

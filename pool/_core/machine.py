"""The slot/task state machine: which task runs where, and what to do when anything happens.

Owns: the protocol between the pool and its workers, as events in and actions out. Its
parts own the policies, and share one ``records.Records``, the only place that moves a
task, a slot or the pool:
- ``placement``: which worker runs which task, pipelining, taking tasks back;
- ``staffing``: starting workers and letting them go;
- ``lifecycle``: how the pool winds down, by shutdown, terminate or breaking, and closes;
- ``escalation``: ending a worker, step by step;
- ``start_failures``: workers that fail to start, starts the system refuses;
- ``stalls``: workers that do not read what they were sent;
- ``deadlines``: every deadline, listed once for the wait and for ``tick``.
Runs in: the dispatcher thread only. It performs no I/O: events come in as method calls
and leave as a list of actions for the dispatcher to carry out; time comes from the
``clock`` it is given, ``time.monotonic`` in the pool and a fake one in tests.
Guarantees:
- a task is sent to a worker once; a worker runs its tasks in the order sent, so the
  first in flight is RUNNING and the rest wait, ASSIGNED;
- when a worker exits, only its RUNNING task ends, as the slot's ``Ending`` says: died
  if nothing was ending it, else timed out, stopped or terminated. Its ASSIGNED tasks go
  back to the front of the queue, or are cancelled when terminating;
- a task's timeout counts from the moment it becomes RUNNING; when it passes, its worker
  is asked for its stack and then killed, and escalation goes on until the process is
  gone or given up on;
- every task ends in exactly one of DONE, FAILED or CANCELLED, and every slot ends EMPTY
  or UNUSED before the machine reports ``closed``;
- the pool's life moves only as ``LIFE_TRANSITIONS`` allows. After ``MAX_START_FAILURES``
  failed starts in a row it is BROKEN: what waits in the queue fails ``BROKEN``, and so
  does every task submitted later. Tasks already sent run on the workers that did start;
  a task that goes back to the queue waits only while a READY worker is left to take it,
  else it fails too. Nothing is started, idle workers are stopped, and once nothing runs
  the broken pool closes by itself. A refused start never breaks the pool;
- it is the only authority on the protocol. A worker's frame out of turn, such as a reply
  for a task it is not running or a second READY, is the worker misbehaving, answered
  like garbage on the wire: ``Misbehaved``, its running task fails ``MISBEHAVED``, a kill.
  An exit first says how the worker left (``WorkerGone``), and which of its tasks never
  started follows from each task's frame size, told once at submit;
- an impossible transition raises ``InvalidTransition`` at once: an internal error, the
  pool's own bug, never a worker's.
Assumes: the dispatcher reports each event once, as it happens, and carries out every
action it is given, in order.
"""

from __future__ import annotations

from typing import Callable

from .actions import Action, Departure, Fail, FailCause, Misbehaved, Reclaim, Resolve
from .actions import Stopped, WorkerGone
from .deadlines import Deadlines
from .escalation import Escalator
from .lifecycle import Lifecycle
from .placement import Placement
from .records import Records
from .start_failures import StartFailures
from .staffing import Staffing
from .states import (WORKING, InvalidTransition, PoolLife, Slot, SlotState, Task,
                     TaskState, Timeouts)



class StateMachine:
    """Events in, actions out. See the module docstring for the guarantees."""

    def __init__(self, max_workers: int, clock: Callable[[], float], *,
                 max_tasks_per_child: int | None = None, pipeline_depth: int = 1,
                 pipeline_max_frame: int = 4096, timeouts: Timeouts = Timeouts(),
                 idle_timeout: float | None = None) -> None:
        """``pipeline_max_frame``: the largest frame, header included, that may be sent
        ahead, behind a running task: ``_wire.limits.PIPELINE_MAX_FRAME`` in the pool."""
        assert max_workers >= 1 and pipeline_depth >= 1 and pipeline_max_frame > 0
        assert idle_timeout is None or idle_timeout > 0
        self._clock = clock
        records = self._records = Records(max_workers, clock)
        self.slots = records.slots
        self._tasks = records.tasks
        self._queue = records.queue
        self._move_task = records.move_task
        self._move_slot = records.move_slot
        self._starts = StartFailures()
        self._escalator = Escalator(records, timeouts)
        self._placement = Placement(records, self._escalator, depth=pipeline_depth,
                                    ahead_max_frame=pipeline_max_frame,
                                    max_tasks_per_child=max_tasks_per_child)
        self._staffing = Staffing(records, self._starts, self._escalator, idle_timeout)
        self._lifecycle = Lifecycle(records, self._starts, self._escalator)
        self._deadlines = Deadlines(records, self._starts, self._escalator, self._staffing)

    # -- queries ------------------------------------------------------------------------

    @property
    def life(self) -> PoolLife:
        return self._records.life

    @property
    def closed(self) -> bool:
        return self._records.life is PoolLife.CLOSED

    @property
    def start_failures(self) -> int:
        return self._starts.failures

    @property
    def refused_starts(self) -> int:
        return self._starts.refused

    def task_state(self, task_id: int) -> TaskState | None:
        """The state of a task still in flight or queued; None once it has ended."""
        task = self._tasks.get(task_id)
        return task.state if task else None

    @property
    def queued(self) -> list[int]:
        return list(self._queue)

    def started_at(self, task_id: int) -> float | None:
        """When a task started RUNNING, on the machine's clock; None if it is not running."""
        task = self._tasks.get(task_id)
        return None if task is None or task.state is not TaskState.RUNNING else task.started

    def running_task(self, index: int) -> int | None:
        """The task the slot's worker is running, the first sent to it, if any."""
        in_flight = self.slots[index].in_flight
        return in_flight[0] if in_flight else None

    def running_count(self) -> int:
        """How many slots are running a task."""
        return sum(1 for slot in self.slots if slot.in_flight)

    def census(self) -> tuple[int, int]:
        """``(queued, sent)``: tasks waiting for a worker, and tasks a worker holds."""
        return len(self._queue), sum(len(slot.in_flight) for slot in self.slots)

    def next_deadline(self) -> float | None:
        """The earliest time ``tick`` has something to do. Runs on every turn."""
        return self._deadlines.earliest()

    # -- events from the caller's side ------------------------------------------------------

    def submit(self, task_id: int, *, frame_bytes: int, timeout: float | None = None,
               schedule: bool = True) -> list[Action]:
        """A new task whose CALL frame is ``frame_bytes`` long, header included: that
        decides whether it may be sent ahead, behind a running task, and how much of a dead
        worker's pipe it fills. ``schedule=False`` only queues it, for a burst of
        submissions that ends with one ``schedule()``: sending them one by one would cost
        a pass over the slots for each."""
        life = self._records.life
        if life is not PoolLife.OPEN and life is not PoolLife.BROKEN:
            raise InvalidTransition(f"submit while {life.name}")
        if task_id in self._tasks:
            raise InvalidTransition(f"task {task_id} submitted twice")
        task = Task(task_id, frame_bytes, frame_bytes <= self._placement.ahead_max_frame,
                    timeout)
        self._tasks[task_id] = task
        if life is PoolLife.BROKEN:  # submitted before the caller could know
            self._move_task(task, TaskState.FAILED)
            return [Fail(task_id, FailCause.BROKEN)]
        self._queue.append(task_id)
        return self._schedule() if schedule else []

    def schedule(self) -> list[Action]:
        """Assign what is queued and start workers, after ``submit(schedule=False)``."""
        return self._schedule()

    def stop_task(self, task_id: int) -> list[Action]:
        """The caller wants this task stopped: cancelled if it has not started, its worker
        killed and replaced if it runs. Nothing happens if it has already ended."""
        task = self._tasks.get(task_id)
        if task is None:
            return []
        if task.state is TaskState.QUEUED:
            self._move_task(task, TaskState.CANCELLED)
            self._queue.forget_ended()
            return [Stopped(task_id)] + self._schedule()
        task.stop_requested = True
        if task.state is TaskState.ASSIGNED:
            # Behind another task in its worker's pipe: take it back. If the worker has
            # already read it, it is stopped when it starts.
            return [Reclaim(next(s for s in self.slots if task_id in s.in_flight).index)]
        # Running: its worker is killed. If it dies before it has read the call, the task
        # never started, but it is not sent again: its caller stopped it.
        slot = next(s for s in self.slots if s.in_flight and s.in_flight[0] == task_id)
        return self._escalator.stop_running(slot)

    def callers_cancelled(self, task_ids: list[int]) -> list[Action]:
        """Their callers cancelled these tasks' futures while they were queued: they leave
        the queue, in O(1) each. Tasks no longer queued are skipped: already sent, which
        ``send_cancelled`` hears of, ended, or never known."""
        actions: list[Action] = []
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            if task is not None and task.state is TaskState.QUEUED:
                self._move_task(task, TaskState.CANCELLED)
                self._queue.forget_ended()
                actions.append(Stopped(task_id))
        return actions + self._schedule() if actions else []

    def shutdown(self, *, cancel_futures: bool) -> list[Action]:
        """Finish what was submitted, or with ``cancel_futures`` only what was sent, then
        stop every worker and close. A broken or terminating pool already does."""
        return self._lifecycle.shutdown(cancel_futures) + self._schedule()

    def terminate(self, signum: int) -> list[Action]:
        """terminate_workers() (SIGTERM) or kill_workers() (SIGKILL): shut down, cancel
        what has not started, and end every worker now, running tasks included."""
        return self.shutdown(cancel_futures=True) + self._lifecycle.terminate(signum)

    # -- events from a worker -------------------------------------------------------------

    def worker_ready(self, index: int, *, pipelining: bool = True) -> list[Action]:
        """The worker is up. ``pipelining``: its pipe can hold tasks queued behind the
        running one, and give them back (``Reclaim``). A second READY, from a worker that
        is already ready, is the worker misbehaving."""
        slot = self.slots[index]
        if slot.state is SlotState.STOPPING:
            return []  # stopped while starting; it will exit at end of file
        if slot.state in WORKING:
            return self.worker_misbehaved(index, "a READY frame from a worker already ready")
        slot.worker.pipelining = pipelining
        self._move_slot(slot, SlotState.READY)
        self._starts.worker_ready()
        return self._schedule()

    def worker_init_failed(self, index: int) -> list[Action]:
        """The worker says its initializer failed; it exits next, and that exit is a failed
        start. Only a starting worker may say so: from one already ready, it is the worker
        misbehaving."""
        if self.slots[index].state in WORKING:
            return self.worker_misbehaved(
                index, "an INIT_FAILED frame from a worker already ready")
        return []

    def worker_over_memory(self, index: int) -> list[Action]:
        """The worker reported, before its reply, that it uses more memory than allowed."""
        slot = self.slots[index]
        slot.worker.over_memory = True
        if slot.state is SlotState.READY:
            self._move_slot(slot, SlotState.RETIRING)
        return self._schedule()

    def task_replied(self, index: int, task_id: int, outcome: object = None) -> list[Action]:
        """A reply arrived; ``outcome``, opaque here, travels in ``Resolve``. A reply for
        any task but the one running is the worker breaking the protocol."""
        return self.tasks_replied(index, [(task_id, outcome)])

    def tasks_replied(self, index: int, replies: list[tuple[int, object]]) -> list[Action]:
        """Replies that arrived together from one worker, in order, each as
        ``task_replied`` takes it. What is queued is assigned once, after all of them: a
        pass over the slots for each would cost more than the reply. A reply out of turn
        ends the batch: the worker misbehaved, and nothing after it is believed."""
        assert replies, "no replies"
        slot = self.slots[index]
        in_flight, worker = slot.in_flight, slot.worker
        tasks = self._tasks
        placement = self._placement
        now = self._clock()  # they arrived together
        actions: list[Action] = []
        for task_id, outcome in replies:
            if not in_flight or in_flight[0] != task_id:
                return actions + self.worker_misbehaved(
                    index, f"a reply for task {task_id}, which it was not running")
            in_flight.popleft()
            task = tasks[task_id]
            self._move_task(task, TaskState.DONE)
            worker.stalls = 0
            if self._starts.failures:
                self._starts.task_completed()
            if task.started is not None:
                worker.last_duration = now - task.started
            actions.append(Resolve(task_id, outcome))
            if slot.stopping is not None:
                self._escalator.replied_while_ending(slot)
            if in_flight:
                if more := placement.start_running(slot, tasks[in_flight[0]], now):
                    actions += more
            else:
                worker.idle_since = now
            if slot.state is SlotState.READY and placement.quota_used(slot):
                self._move_slot(slot, SlotState.RETIRING)
        return actions + self._schedule()

    def worker_misbehaved(self, index: int, reason: str = "") -> list[Action]:
        """The worker sent garbage (``reason`` says what): fail its running task, requeue
        the rest, kill it."""
        slot = self.slots[index]
        actions: list[Action] = [Misbehaved(index, reason)]
        if slot.in_flight:
            running = slot.in_flight.popleft()
            self._move_task(self._tasks[running], TaskState.FAILED)
            actions.append(Fail(running, FailCause.MISBEHAVED, index, reason=reason))
        actions += self._placement.requeue_in_flight(slot)
        return actions + self._escalator.kill(slot) + self._schedule()

    def worker_exited(self, index: int, *, unread_bytes: int = 0, exited: object = None,
                      lost_track: bool = False) -> list[Action]:
        """The slot's process is gone, its last replies delivered, or given up on after
        SIGKILL's grace. ``exited``, opaque here, is what is known of it, for the actions
        that report it. ``unread_bytes``: how much of what was written to its task pipe it
        never read, which tells the tasks that never started (``Placement.worker_gone``).
        ``lost_track``: the pool ended it because it could no longer watch it, as when its
        forkserver exited: a start it ends says nothing, and does not count as failed."""
        slot = self.slots[index]
        if slot.state is SlotState.STOPPING:
            departure = Departure.ASKED
        elif slot.state is SlotState.STARTING:
            departure = Departure.AT_START
        else:
            departure = Departure.RUNNING if slot.in_flight else Departure.IDLE
        gone: list[Action] = [WorkerGone(index, departure, exited)]
        return gone + self._emptied(slot, unread_bytes, exited, failed_start=not lost_track)

    # -- events from the dispatcher's own work ------------------------------------------------

    def send_cancelled(self, index: int, task_id: int) -> list[Action]:
        """A task the machine said to send was found cancelled; it was not sent."""
        slot = self.slots[index]
        actions = self._placement.withdraw(slot, task_id)
        self._move_task(self._tasks[task_id], TaskState.CANCELLED)
        self._placement.reopen_if_quota_left(slot)
        return actions + self._schedule()

    def send_failed(self, index: int, task_id: int) -> list[Action]:
        """Writing the task to its worker failed: the worker never got it, and is broken.
        The task goes back to the front of the queue, as any task that never started; the
        worker is killed, and its exit fails whatever it had received and was running."""
        slot = self.slots[index]
        actions = self._placement.withdraw(slot, task_id)
        actions += self._placement.requeue([task_id])
        return actions + self._escalator.kill(slot) + self._schedule()

    def tasks_reclaimed(self, index: int, task_ids: list[int]) -> list[Action]:
        """These tasks sent to the slot, in send order, were taken back from its pipe
        unread: they go back to the front of the queue, or end if stopped. The worker may
        have read others meanwhile: see ``Placement.taken_back``."""
        slot = self.slots[index]
        checking_read, slot.worker.checking_read = slot.worker.checking_read, False
        if not task_ids:
            return []
        return self._placement.taken_back(slot, task_ids, checking_read) + self._schedule()

    def spawn_failed(self, index: int) -> list[Action]:
        """Starting the process raised in the parent: a failed start. This and
        ``spawn_refused`` may come for a slot already asked to stop: the failure of one of
        the starts an event asked for can wind the pool down and stop the others before
        they are tried. An action to end a slot whose start then fails names no process;
        the loop skips it."""
        return self._emptied(self.slots[index], 0, None)

    def spawn_refused(self, index: int) -> list[Action]:
        """The system refused to start the slot's process for want of a resource. Not a
        failed start: the slot is tried again later, and what is queued may fail
        ``REFUSED`` (``start_failures``)."""
        self._move_slot(self.slots[index], SlotState.EMPTY)  # refilled when tried again
        self._starts.start_refused(self._clock())
        return self._lifecycle.fail_if_refused_too_long() + self._schedule()

    def tick(self) -> list[Action]:
        """Fire the deadlines that have passed (``deadlines``)."""
        actions, schedule = self._deadlines.fire_due(self._clock())
        return actions + self._schedule() if schedule else actions

    # -- internals ----------------------------------------------------------------------------

    def _emptied(self, slot: Slot, unread_bytes: int, exited: object,
                 failed_start: bool = True) -> list[Action]:
        """The slot's process is gone: the pool breaks if workers keep failing to start."""
        if slot.state is SlotState.STARTING and failed_start:
            self._starts.start_failed()
        actions = self._placement.worker_gone(slot, unread_bytes, exited)
        self._move_slot(slot, SlotState.EMPTY)
        return actions + self._lifecycle.break_if_failing() + self._schedule()

    def _schedule(self) -> list[Action]:
        """Assign queued tasks, fail those no worker will come for, start or refill
        workers, stop those not needed, and close an ending pool once all is done."""
        actions = self._placement.assign() if self._queue else []
        if self._records.life is not PoolLife.OPEN:
            actions += self._lifecycle.fail_stranded()
        actions += self._staffing.spawn()
        actions += self._staffing.stop_unneeded()
        if self._records.life is not PoolLife.OPEN:
            self._lifecycle.close_if_done()
        return actions

"""The loop: the one thread that owns every worker process, pipe and in-flight task.

::

 caller threads                   dispatcher thread "pool-dispatcher-N"       worker processes
 ──────────────                   ─────────────────────────────────────       ────────────────
 Dispatcher (front)               Loop.run: while not done: _turn()            worker_main:
  .submit_many(calls)              ready = wait([wakeup.reader,                  FrameStream.next
  .shutdown .stop_task(id)                    *reply fds, *sentinels],           run fn(*args)
  .terminate(signum) .snapshot()              timeout=next deadline)             write_frame(RESULT
   Submit|Shutdown|StopTask|       drain_cancels   (take_cancels → StateMachine.    | RAISED)
   Terminate|Sync                                   callers_cancelled)
   ─► _commands, _wakeup.wake()    drain_wakeups   (take_commands: Submit,
  .cancelled(id)                                    Shutdown, StopTask, Terminate,
   ─► _cancels (no lock, no wake)                   Sync → publish_census, latch)
                                   deliver_replies (worker_events: frames → Replied,
 future.result() ◄── resolve ◄──                    Ready, InitFailed, OverMemory,
 done-callbacks ◄── CallbackRunner                  BrokeProtocol; tell → State-
 (own threads)                                      Machine.tasks_replied, ...)
 .processes .census .stats ◄──     handle_exits    (its last replies first; then
   publish_processes,                               WorkerHandle.finish → State-
   publish_census                                   Machine.worker_exited)
                                   fire_deadlines  (once due: StateMachine.tick;  DUMP_SIGNAL:
                                                    Reaper.check_groups)           stack → exit
                                   flush_sends     (WorkerHandle.flush: a packet
                                                    per small frame; a thread
                                                    writes a large one)
                                   Performer.perform(the machine's actions:     _watch_parent:
                                     Resolve, Send, Fail, WorkerGone,            lifeline hang-up
                                     Misbehaved, Stopped, Cancel, Spawn,          → killpg, exit
                                     Reclaim, AskToExit, Signal, DumpStack,
                                     Unreaped, Broken)

Owns: the ``StateMachine`` (and with it the pool's life), the ``Performer`` (the workers, the
submissions in flight, the counts), the ``Reaper`` (workers and process groups not yet
confirmed gone) and the errors decoded this turn. The front holds the thread. It shares
nothing with callers but its front (``commands.Front``) and the wakeup handle.
Runs in: the dispatcher thread, but for ``new_thread`` (the caller that submits first,
under the front's lock) and ``close_in_forked_child`` (a forked child).
Guarantees:
- replies already written by a worker are delivered before its exit is handled, so a task
  that returned before its worker died succeeds;
- no user callback runs here: done-callbacks go to the ``CallbackRunner``. Unpickling a
  result does run its reducers here, as in the stdlib; any error they raise fails only
  that task's future;
- the loop ends in a firewall: if it raises, every unresolved future gets
  ``PoolInternalError`` chained to the cause, every worker is killed, and later submits
  raise it;
- a worker's exit closes all four of its descriptors and reaps it, so nothing accumulates;
  what is left of it is the reaper's, until confirmed gone or reported;
- the loop ends only when every task is resolved, every worker reaped (or reported) and
  every lingering process group gone (or reported); then every command still queued is
  answered, and the front says the loop ended.
Assumes: callers reach it only through the front's queues and the wakeup handle.
"""

from __future__ import annotations

import logging
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from .. import _exit, _shake
from .._core.machine import StateMachine
from .._core.states import Timeouts
from .._errors import PoolInternalError
from .._callbacks import CallbackRunner, install_on_dispatcher_thread
from .._wire import limits, segments
from .._wire.exceptions import release_frames
from .._worker.handle import WorkerHandle
from .._worker.main import Initializer
from .commands import Front, Shutdown, StopTask, Submission, Submit, Sync, Terminate
from .events import tell, worker_events
from .outcomes import format_error, warn_if_descriptors_short
from .perform import Performer
from .reaper import Reaper
from .wakeup import Wakeup

logger = logging.getLogger("pool")


class Loop:
    """The dispatcher thread's loop: each turn waits for something to happen, tells the
    machine, and has the performer carry out what it answers."""

    def __init__(self, front: Front, callbacks: CallbackRunner, *, max_workers: int,
                 mp_context: Any, initializer: Initializer | None,
                 max_tasks_per_child: int | None, max_memory_per_child: int | None,
                 pipeline_depth: int, timeouts: Timeouts, idle_timeout: float | None) -> None:
        self.name = front.name
        self._front = front
        self._callbacks = callbacks
        self._machine = StateMachine(max_workers, time.monotonic,
                                     max_tasks_per_child=max_tasks_per_child,
                                     pipeline_depth=pipeline_depth,
                                     pipeline_max_frame=limits.PIPELINE_MAX_FRAME,
                                     timeouts=timeouts,
                                     idle_timeout=idle_timeout)
        self._reaper = Reaper(self.name, timeouts.kill)
        self._performer = Performer(front, self._machine, self._reaper, mp_context=mp_context,
                                    initializer=initializer,
                                    max_tasks_per_child=max_tasks_per_child,
                                    max_memory_per_child=max_memory_per_child)
        self._workers = self._performer.workers  # read here; the performer changes it
        warn_if_descriptors_short(self.name, max_workers)
        self._decoded_errors: list[BaseException] = []  # this turn's; see release_frames
        # When to take back the loans of idle workers (_wire.loans.LoanDesk.take_back).
        self._loans_due: float | None = None
        self._injected_fault: BaseException | None = None  # tests: make the loop fail
        self._wakeup: Wakeup | None = None

    def new_thread(self, wakeup: Wakeup) -> threading.Thread:
        """A thread to run the loop, not started (caller thread, under the front's lock).
        ``wakeup`` is how callers wake it. Opens what the workers inherit on the first
        call only; if a Ctrl-C cut a call short, the next one opens it."""
        if not self._performer.opened:
            self._performer.open(wakeup)
        self._wakeup = wakeup
        return threading.Thread(target=self._run_if_owned, name=self.name, daemon=True)

    def _run_if_owned(self) -> None:
        # A start that a Ctrl-C interrupted disowns its thread (``Dispatcher._start_thread``)
        # before it lets go of the front's lock, which this waits for: the thread runs the
        # loop only if it is still the front's.
        if self._front.owns_loop(threading.current_thread()):
            self.run()

    def close_in_forked_child(self) -> None:
        """In a child that some thread of ours forked: see ``Performer``'s."""
        self._performer.close_in_forked_child()

    def run(self) -> None:
        install_on_dispatcher_thread(self._callbacks)
        cache = segments.cache  # (a forked child gets a cache of its own)
        cache.dispatcher_started()
        try:
            first = True
            while not (self._machine.closed and not self._reaper.watching):
                self._turn()
                if first:  # it started the workers
                    first = False
                    # What stats() needs, imported while they start: not before
                    # (dataclasses cost a script's first result 13 ms), nor when first
                    # asked (a program out of descriptors could not open the module).
                    # Under fork it was imported before any fork (_first_task).
                    try:
                        from .. import _stats
                        del _stats  # (imported for the module to be loaded)
                    except (ImportError, OSError):
                        pass  # imported when first needed, then
        except BaseException as exc:  # the firewall: never a hang, never a silent death
            self._fail_everything(exc)
        finally:
            try:
                try:
                    self._release()
                finally:
                    cache.dispatcher_ended()
            finally:  # even if releasing failed, nobody may wait for this loop forever
                if _shake.on:
                    _shake.pause("loop.before_end")
                try:
                    if self._front.loop_ended():  # releasing raised before it got there
                        self._answer_leftovers()
                finally:
                    self._front.signal_ended()
                    if _shake.on:
                        _shake.pause("loop.after_end")

    def _turn(self) -> None:
        if self._injected_fault is not None:
            raise self._injected_fault
        deadline = self._machine.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        timeout = self._reaper.wait_timeout(timeout)
        if segments.cache.count:  # idle shared memory goes back to the system in time
            trim_at = segments.cache.trim()
            if self._loans_due is not None:
                trim_at = self._loans_due if trim_at is None else min(trim_at, self._loans_due)
            if trim_at is not None:
                wait_trim = max(0.0, trim_at - time.monotonic())
                timeout = wait_trim if timeout is None else min(timeout, wait_trim)
        ready: set[int] = set(wait(self._watched(), timeout))  # type: ignore[arg-type]
        if _shake.on:
            _shake.pause("loop.after_wait")
        self.drain_cancels()
        self.drain_wakeups(ready)
        self.deliver_replies(ready)
        if _shake.on:
            _shake.pause("loop.before_exits")
        self.handle_exits(ready)
        self.fire_deadlines(deadline)
        self.flush_sends()
        self.release_decoded_errors()

    def _watched(self) -> list[int]:
        assert self._wakeup is not None
        fds = [self._wakeup.reader]
        for worker in self._workers.values():
            fds.append(worker.sentinel)
            if worker.watch_replies:
                fds.append(worker.reader.fd)
        return fds

    def drain_cancels(self) -> None:
        """Take the tasks their callers cancelled out of the queue, all in one pass."""
        if task_ids := self._front.take_cancels():
            self._performer.perform(self._machine.callers_cancelled(task_ids))

    def drain_wakeups(self, ready: set[int]) -> None:
        """Act on every command callers queued, in order. Submissions are sent in one pass
        once a run of them has been queued."""
        assert self._wakeup is not None
        if self._wakeup.reader not in ready:
            return
        self._wakeup.drain()  # before reading the queue, so no wake() is lost
        perform, machine = self._performer.perform, self._machine
        unscheduled = False  # submissions queued, not yet sent
        for command in self._front.take_commands():
            if isinstance(command, Submit):
                unscheduled |= self._take_in(command.submissions)
                continue
            if unscheduled:
                perform(machine.schedule())
                unscheduled = False
            match command:
                case Sync():
                    self.drain_cancels()  # those a caller made before asking
                    self._performer.publish_census()
                    command.done.set()
                case Shutdown():
                    perform(machine.shutdown(cancel_futures=command.cancel_futures))
                case StopTask():
                    perform(machine.stop_task(command.task_id))
                case Terminate():
                    perform(machine.terminate(command.signum))
        if unscheduled:
            perform(machine.schedule())

    def _take_in(self, submissions: list[Submission]) -> bool:
        """Tell the machine of submissions, without sending them yet; True if it queued
        any (those cancelled already, or submitted after it closed, it never hears of)."""
        machine, performer = self._machine, self._performer
        queued = False
        for submission in submissions:
            if submission.future.cancelled() or machine.closed:
                performer.refuse(submission)
                continue
            performer.take_in(submission)
            if actions := machine.submit(submission.info.task_id,
                                         frame_bytes=submission.frame_bytes,
                                         timeout=submission.timeout, schedule=False):
                performer.perform(actions)  # a broken pool fails it at once
            queued = True
        return queued

    def deliver_replies(self, ready: set[int]) -> None:
        for index, worker in list(self._workers.items()):
            if worker.reader.fd in ready:
                self._read_worker(index, worker)

    def handle_exits(self, ready: set[int]) -> None:
        for index, worker in list(self._workers.items()):
            if worker.sentinel in ready:
                self._read_worker(index, worker)  # replies before deaths, to the last byte
                self._worker_exited(index, worker)

    def fire_deadlines(self, due: float | None) -> None:
        """Tick the machine if what was due first when this turn began (``due``) has
        come. A deadline set during the turn lies after the moment it was set, and the
        next turn's wait ends by then, so it is not missed; ticking every turn would cost
        passes over the slots for every batch of replies. Idle workers' loans are taken
        back once due."""
        now = time.monotonic()
        if due is not None and now >= due:
            self._performer.perform(self._machine.tick())
        self._reaper.check_groups()
        if self._loans_due is not None and now >= self._loans_due:
            self._loans_due = (now + segments.IDLE_SECONDS
                               if self._performer.take_back_idle_loans() else None)

    def flush_sends(self) -> None:
        """Write every frame queued this turn (so replies read in one batch are answered in
        one batch), after collecting the threads that finished writing a large frame."""
        perform, machine = self._performer.perform, self._machine
        for index, worker in list(self._workers.items()):
            if worker.writer is not None and (failed := worker.collect_writer()) is not None:
                perform(machine.send_failed(index, failed))
        while pending := [(index, w) for index, w in self._workers.items()
                          if w.outbox and w.writer is None]:
            for index, worker in pending:
                # Not written: the worker died before reading them, so they never started;
                # its sentinel follows. Requeued last-first, so that they keep their order.
                for task_id in reversed(worker.flush()):
                    perform(machine.send_failed(index, task_id))

    def release_decoded_errors(self) -> None:
        """Let the errors decoded this turn go of the frames that decoded them, now that
        those have returned."""
        if self._decoded_errors:
            for error in self._decoded_errors:
                release_frames(error)
            self._decoded_errors.clear()

    def _read_worker(self, index: int, worker: WorkerHandle) -> None:
        if worker.misbehaved:
            return  # the machine called it misbehaving: nothing more is read from it
        for event in worker_events(worker, self._decoded_errors):
            self._performer.perform(tell(self._machine, index, worker, event, self.name))
            if worker.misbehaved:
                return
        if worker.desk is not None and worker.desk.loan is None:
            # Its large result came in the segment it was lent (or none could be had):
            # another, now that the tasks replied to have let go of their calls' segments,
            # which can be lent again with their pages already touched. Taken back if the
            # worker is idle when it is due (take_back_idle_loans).
            worker.desk.lend()
            if self._loans_due is None and worker.desk.loan is not None:
                self._loans_due = time.monotonic() + segments.IDLE_SECONDS

    def _worker_exited(self, index: int, worker: WorkerHandle) -> None:
        """Reap a worker whose sentinel fired, and tell the machine how it ended."""
        exited = worker.finish()
        self._performer.forget_worker(index)
        if exited.exitcode is None:
            self._reaper.unreaped(worker, "exited but could not be reaped")
        self._reaper.watch_group(exited)
        self._performer.perform(self._machine.worker_exited(
            index, unread_bytes=exited.unread_task_bytes, exited=exited,
            lost_track=bool(exited.ended_because)))

    # -- failure and release ------------------------------------------------------------

    def _fail_everything(self, cause: BaseException) -> None:
        logger.critical("%s: internal error; failing every pending task", self.name,
                        exc_info=cause)
        error = PoolInternalError(f"the pool's dispatcher failed: {format_error(cause)}")
        error.__cause__ = cause
        self._front.loop_failed(error)  # the machine's records no longer describe anything
        self._performer.fail_all(error)
        self._answer_leftovers()
        self._performer.kill_all()

    def _release(self) -> None:
        """Reap every worker left (only after a failure), end the admission, answer what
        is left, and close every descriptor."""
        self._performer.release_workers()
        self._performer.publish_census()
        self._reaper.last_try()
        assert self._wakeup is not None
        if self._front.loop_ended():
            self._answer_leftovers()
        self._wakeup.close()
        self._performer.close()
        self._callbacks.close()
        _exit.forget(self._front)

    def _answer_leftovers(self) -> None:
        """Once the loop has failed or ended, answer every command still queued: nothing
        will act on them (a ``Sync`` is released, a ``Submit`` refused)."""
        for command in self._front.take_commands():
            if isinstance(command, Sync):
                command.done.set()
            elif isinstance(command, Submit):
                for submission in command.submissions:
                    self._performer.refuse(submission)

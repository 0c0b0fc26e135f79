"""The dispatcher: one thread that owns every worker process, pipe and in-flight task.

::

 caller threads                   dispatcher thread "pool-dispatcher-N"       worker processes
 ──────────────                   ─────────────────────────────────────       ────────────────
 Dispatcher.submit_many(records)  _run: while not done: _turn()                worker_main:
 Dispatcher.stop_task(id)          ready = wait([_wakeup.reader,                 FrameStream.next
 Dispatcher.terminate(signum)                 *reply fds, *sentinels],           run fn(*args)
 Dispatcher.live_processes()                  timeout=next deadline)             write_frame(RESULT
   Submit|StopTask|Terminate|Sync  drain_cancels   (_cancels → StateMachine.        | RAISED)
   ─► _commands, _wakeup.wake()                     callers_cancelled)
 Dispatcher.cancelled(id)         drain_wakeups   (Submit, Shutdown, StopTask,
   ─► _cancels (no lock, no wake)                   Terminate, Sync → census and
                                                    stats published, latch)
 future.result() ◄── resolve ◄──   deliver_replies (WorkerHandle.read: FrameReader;
 done-callbacks ◄── CallbackRunner                  the replies of a read → State-
 (own threads)                                      Machine.tasks_replied; other
                                                    frames → worker_ready / ...)
                                   handle_exits    (WorkerHandle.finish: an Exit →
                                                    StateMachine.worker_exited)
                                   fire_deadlines  (once due: task timeouts →     DUMP_SIGNAL:
                                                    DumpStack; escalation;         stack → exit
                                                    lingering groups)
                                   flush_sends     (WorkerHandle.flush: a packet
                                                    per small frame; a thread
                                                    writes a large one)
                                   _perform(actions of the StateMachine:        _watch_parent:
                                     Spawn, Send, Resolve, Fail (→ WorkerDied,   lifeline hang-up
                                     TaskTimeout, ...), Stopped, Reclaim,         → killpg, exit
                                     AskToExit, Signal, DumpStack, Misbehaved,
                                     WorkerGone, Unreaped, Broken)

Owns: the ``StateMachine`` (and with it the pool's life), the ``LoopLife`` that callers read
(may submit() queue, does a command reach the loop), the task records, one ``WorkerHandle``
per live worker, the pool's lifeline pipe, the wakeup handle, and the ``Counters`` behind
``stats()`` (published as ``self.stats`` when a caller's ``Sync`` arrives, never per turn).
Runs in: the dispatcher thread, except the methods marked "caller thread".
Guarantees:
- replies already written by a worker are delivered before its exit is handled, so a task
  that returned before its worker died succeeds;
- no user callback runs here: done-callbacks go to the ``CallbackRunner``, and messages
  that repr user objects are built lazily by the exceptions themselves. (Unpickling a
  result does run its reducers here, as in the stdlib; any error they raise fails only
  that task's future.)
- the loop ends in a firewall: if it raises, every unresolved future gets
  ``PoolInternalError`` chained to the cause, every worker is killed, and later submits
  raise it;
- a worker's exit closes all four of its descriptors and reaps it, so nothing accumulates;
  members of its process group still running after it are watched until they are gone, or
  reported by pid after SIGKILL's grace; a worker that cannot be reaped is reported by pid
  and its slot refilled, never assumed gone;
- the loop ends only when every task is resolved, every worker reaped (or reported) and
  every lingering process group gone (or reported).
Assumes: callers enqueue commands only through ``submit``, ``shutdown``, ``stop_task``,
``cancelled``, ``terminate`` and ``live_processes``/``snapshot``; the thread is
the only reader and writer of every attribute not marked as shared.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator

from .._core.actions import FailCause
from .._core import actions as _actions, states as _records, machine as _state
from .. import _exit
from .._wire import frames as _frames, limits as _limits, pickling as _pickling
from .._worker import teardown as _teardown
from .commands import (Command, EncodedCall, Shutdown, StopTask, Submission, Submit, Sync,
                       Terminate)
from .._errors import (PoolInternalError, TaskInfo, WorkerDied, WorkerProtocolError, copy_error,
                       describe_exit)
from .._futures import CallbackRunner, Latch, PoolFuture, install_on_dispatcher_thread
from .._worker.main_guard import keep_main_importable
from .outcomes import (StartFailures, failure, format_error, is_refusal, resolve,
                       warn_if_descriptors_short)
from .._core.machine import StateMachine
from .._stats import Counters, Outcome, PoolStats, WorkerStats
from .wakeup import Wakeup
from .._wire.frames import Frame, Kind
from .._worker.main import Initializer
from .._worker.handle import Exit, WorkerHandle

logger = logging.getLogger("pool")

_dispatcher_numbers = itertools.count(1)

# While a worker's process group still has running members after the worker's exit, the
# loop re-checks it this often (only then: an idle pool never wakes up on its own).
_LINGERING_POLL_SECONDS = 0.01


class LoopLife(enum.Enum):
    """The loop's life as its callers see it (shared: moved under ``_lock``, and read under
    it wherever a decision depends on it; ``closing`` and ``repr`` read it without).

    The pool's own life (open, broken, draining, terminating, closed) is the state
    machine's ``PoolLife``, which the loop alone reads; this is what a caller thread needs
    to know without asking the loop: whether ``submit`` may queue, whether a command still
    reaches the loop, and whether anything is left to wait for. ``broken_error`` is not a
    state but what ``submit`` raises once set (workers cannot start, or the loop failed).
    Its table lives here, not in ``_records`` (the state machine's), as the loop's own.
    """

    __hash__ = object.__hash__

    OPEN = "open"        # submit() queues tasks (the loop starts at the first)
    CLOSING = "closing"  # shutdown() or a terminate was called: submit() refuses; the loop
                         # finishes what it has
    FAILED = "failed"    # the loop raised: every future failed (the firewall); releasing
    ENDED = "ended"      # the loop has let everything go, or never started: commands are
                         # dropped; ``finished`` and ``_ended`` are set just after


_LOOP_TRANSITIONS: dict[LoopLife, frozenset[LoopLife]] = {
    # OPEN -> ENDED: a broken pool's machine closes by itself, with no shutdown() called.
    LoopLife.OPEN: frozenset({LoopLife.CLOSING, LoopLife.FAILED, LoopLife.ENDED}),
    LoopLife.CLOSING: frozenset({LoopLife.FAILED, LoopLife.ENDED}),
    LoopLife.FAILED: frozenset({LoopLife.ENDED}),
    LoopLife.ENDED: frozenset(),
}


class Dispatcher:
    def __init__(self, *, max_workers: int, mp_context: Any, initializer: Initializer | None,
                 max_tasks_per_child: int | None, max_memory_per_child: int | None = None,
                 pipeline_depth: int = _limits.PIPELINE_DEPTH,
                 timeouts: _records.Timeouts = _records.Timeouts(),
                 idle_timeout: float | None = None) -> None:
        _limits.check_pipeline(pipeline_depth)
        self.name = f"pool-dispatcher-{next(_dispatcher_numbers)}"
        self._ctx = mp_context
        self._fork = mp_context.get_start_method() == "fork"
        self._initializer = initializer
        self._max_tasks = max_tasks_per_child
        self._max_memory = max_memory_per_child
        self._timeouts = timeouts
        self._machine = StateMachine(max_workers, time.monotonic,
                                     max_tasks_per_child=max_tasks_per_child,
                                     pipeline_depth=pipeline_depth,
                                     pipeline_max_frame=_limits.PIPELINE_MAX_FRAME,
                                     timeouts=timeouts,
                                     idle_timeout=idle_timeout)
        self._tasks: dict[int, Submission] = {}
        self._workers: dict[int, WorkerHandle] = {}  # a slot's index -> its live worker
        self._abandoned: list[WorkerHandle] = []     # survived SIGKILL's grace; reported
        self._lingering: dict[int, float] = {}       # process group -> when to give up on it
        self._start_failures = StartFailures(self.name)
        warn_if_descriptors_short(self.name, max_workers)
        self._callbacks = CallbackRunner(f"{self.name}-callbacks")
        self._injected_fault: BaseException | None = None  # tests: make the loop fail
        self._decoded_errors: list[BaseException] = []  # this turn's; see release_frames
        self._counters = Counters()
        # Shared with caller threads: guarded by _lock (taken by the loop only to publish
        # what callers decide on: broken_error and the LoopLife).
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue[int] = queue.SimpleQueue()  # see cancelled()
        self._task_ids = itertools.count(1)
        self._owner_pid = os.getpid()
        self._life = LoopLife.OPEN
        # Resolved once the loop has released everything (at once if it never started).
        # Callers wait for this, never for the thread: on 3.11, a KeyboardInterrupt inside
        # Thread.join() can leave a thread that still runs marked as stopped (the bpo-45274
        # handling), and a second join() would then return at once.
        self.finished: Future[None] = Future()
        # The same fact for callers that wait in a thread: a latch, which a Ctrl-C in the
        # wait cannot leave locked for the loop to block on (see _futures.Latch).
        self._ended = Latch()
        self.broken_error: BaseException | None = None
        # Published by the loop for callers to read (replaced whole, never mutated): the
        # live workers' Process objects by pid (``executor._processes``), and
        # ``StateMachine.census()`` and the stats when a caller last asked (``snapshot``,
        # for ``repr`` and ``stats()``; not every turn: nothing else reads them).
        self.processes: dict[int, Any] = {}
        self.census = (0, 0)
        self.stats: PoolStats = self._counters.snapshot(0, 0, ())
        self._thread: threading.Thread | None = None
        self._wakeup: Wakeup | None = None
        self._lifeline: tuple[int, int] | None = None

    # -- caller threads -------------------------------------------------------------------

    def check_open(self) -> None:
        """Raise what ``submit`` would raise now (caller thread; call under ``_lock``
        to be sure, or before pickling, to fail early)."""
        if os.getpid() != self._owner_pid:
            # A fork() of the parent copied this object but not its dispatcher thread.
            raise RuntimeError(f"this pool belongs to process {self._owner_pid}; a forked "
                               f"child ({os.getpid()}) cannot use it")
        if self.broken_error is not None:
            raise copy_error(self.broken_error)
        if self._life is not LoopLife.OPEN:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if _exit.interpreter_exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               body: _frames.Buffers, timeout: float | None = None) -> PoolFuture[Any]:
        """Queue one encoded call (caller thread). Raises if the pool cannot take it."""
        return self.submit_many([(fn, args, kwargs, body)], timeout)[0]

    def submit_many(self, calls: list[EncodedCall], timeout: float | None = None
                    ) -> list[PoolFuture[Any]]:
        """Queue encoded calls ``(fn, args, kwargs, body)``, in order, as one command with
        one wake-up (caller thread; ``map`` submits its input in groups). Raises, queuing
        none of them, if the pool cannot take them."""
        futures: list[PoolFuture[Any]] = []
        records = []
        header = _frames.HEADER.size
        with self._lock:
            self.check_open()
            self._start_thread()
            for fn, args, kwargs, body in calls:
                future: PoolFuture[Any] = PoolFuture()
                task_id = next(self._task_ids)
                future._stopper, future._task_id = self, task_id
                records.append(Submission(TaskInfo(task_id, fn, args, kwargs), future, body,
                                          header + _frames.size_of(body), timeout))
                futures.append(future)
            self._commands.put(Submit(records))
        assert self._wakeup is not None
        self._wakeup.wake()
        return futures

    def live_processes(self, timeout: float = 5.0) -> dict[int, Any]:
        """The live workers by pid once the loop has acted on everything submitted before
        this call (caller thread): as with the stdlib, which starts workers inside
        ``submit()``, the workers started for those tasks are listed. Waits at most
        ``timeout`` for the loop (on a latch: contract 9)."""
        return self.snapshot(timeout)[0]

    def snapshot(self, timeout: float = 5.0) -> tuple[dict[int, Any], tuple[int, int]]:
        """``(processes, census)`` once the loop has acted on everything queued before this
        call (caller thread; see ``live_processes``); ``self.stats`` is then as fresh."""
        if os.getpid() != self._owner_pid:
            self.stats = Counters().snapshot(0, 0, ())
            return {}, (0, 0)  # a forked copy of the parent: none of these are its own
        latch = Latch()
        with self._lock:
            waits = (self._thread is not None and self._life is not LoopLife.ENDED
                     and self._thread is not threading.current_thread())
            if waits:
                self._commands.put(Sync(latch))
        if waits:
            assert self._wakeup is not None
            self._wakeup.wake()
            if not latch.wait(timeout):
                logger.warning("%s: the loop did not answer in %g s; the workers listed may "
                               "be out of date", self.name, timeout)
        return self.processes, self.census

    def stop_task(self, task_id: int) -> None:
        """Ask for a task to be stopped (caller thread; ``PoolFuture.stop``)."""
        self._command(StopTask(task_id))

    def cancelled(self, task_id: int) -> None:
        """A caller cancelled this task's future (``PoolFuture.cancel``; any thread, a
        signal handler or a forked copy included: a ``SimpleQueue`` put takes no lock and
        wakes nothing). The loop takes it out of the queue at its next turn, before it
        answers any caller (so ``stats()`` never counts it queued)."""
        self._cancels.put(task_id)

    def _command(self, command: Command) -> None:
        """Hand the loop a command (caller thread); dropped once the loop has ended."""
        with self._lock:
            if self._thread is None or self._life is LoopLife.ENDED:
                return
            self._commands.put(command)
        assert self._wakeup is not None
        self._wakeup.wake()

    def terminate(self, signum: int, wait: bool) -> None:
        """terminate_workers() / kill_workers() (caller thread): cancel what has not started,
        end every worker now with ``signum`` (escalating to SIGKILL), and with ``wait``,
        return once every worker is reaped or reported."""
        self.shutdown(wait=False, cancel_futures=True)
        self._command(Terminate(signum))
        if wait:
            self.join()

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        """Ask the loop to finish (caller thread); with ``wait``, until it has."""
        with self._lock:
            started = self._thread is not None
            if started and (self._life is LoopLife.OPEN or cancel_futures):
                self._commands.put(Shutdown(cancel_futures))
            if self._life is LoopLife.OPEN:
                self._become(LoopLife.CLOSING)
            ends_now = not started and self._life is not LoopLife.ENDED
            if ends_now:
                self._become(LoopLife.ENDED)  # nothing ever ran: nothing to wait for
        if ends_now:  # (only the thread that ended it: two shutdowns may race here)
            self._signal_ended()
        if started:
            assert self._wakeup is not None
            self._wakeup.wake()
            if wait:
                self.join()

    def join(self, callback_timeout: float | None = None) -> None:
        """Wait for the loop to end (caller thread), then for the callbacks it queued: as
        with the stdlib, whose manager thread runs them, every callback of a resolved
        future has run when shutdown(wait=True) returns. ``callback_timeout`` bounds that
        second wait (interpreter exit does not wait forever for a blocked callback).

        A Ctrl-C while waiting for the loop stops waiting for the tasks: the workers are
        terminated (a second Ctrl-C kills them), and once they are gone the
        KeyboardInterrupt goes on. Every wait of a caller comes through here.
        """
        if self._thread is None or self._thread is threading.current_thread():
            return
        try:
            self._ended.wait()
        except KeyboardInterrupt:
            self.terminate(signal.SIGTERM, wait=False)
            try:
                self._ended.wait()
            except KeyboardInterrupt:
                self.terminate(signal.SIGKILL, wait=False)
                self._ended.wait()
            raise
        blocked = self._callbacks.join(callback_timeout)
        if blocked:
            logger.warning("%s: not waiting for %d done-callback(s) still running",
                           self.name, len(blocked))

    @property
    def stop_grace(self) -> float:
        return self._timeouts.stop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def closing(self) -> bool:
        """``submit`` refuses for good: ``shutdown()`` or a terminate was called, the loop
        failed, or it ended by itself (a broken pool)."""
        return self._life is not LoopLife.OPEN

    def _become(self, new: LoopLife) -> None:
        """Move the loop's life (under ``_lock``) as ``_LOOP_TRANSITIONS`` allows."""
        if new not in _LOOP_TRANSITIONS[self._life]:
            raise _records.InvalidTransition(f"{self.name}: {self._life.name} -> {new.name}")
        self._life = new

    def _signal_ended(self) -> None:
        """Wake every waiter once the life is ENDED (outside ``_lock``: a done-callback of
        ``finished`` runs here). Called once, by the thread that moved the life to ENDED."""
        if not self.finished.done():
            self.finished.set_result(None)
        self._ended.set()

    def close_in_forked_child(self) -> None:
        """Runs in a child that some thread of ours forked (``os.register_at_fork``): close
        the copies of the descriptors that decide when workers exit, so that a long-lived
        child cannot keep the workers of a dead parent alive (lifeline) or keep a worker
        asked to stop from seeing end of file (task pipes)."""
        fds = [self._lifeline[1]] if self._lifeline is not None else []
        for worker in list(self._workers.values()):
            fds += worker.task_pipe_fds()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _start_thread(self) -> None:
        if self._thread is not None:
            return
        self._wakeup = Wakeup()
        self._lifeline = os.pipe()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        _exit.shut_down_at_exit(self)

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        install_on_dispatcher_thread(self._callbacks)
        try:
            while not (self._machine.closed and not self._lingering):
                self._turn()
        except BaseException as exc:  # the firewall: never a hang, never a silent death
            self._fail_everything(exc)
        finally:
            try:
                self._release()
            finally:  # even if releasing failed, nobody may wait for this loop forever
                try:
                    with self._lock:
                        released = self._life is LoopLife.ENDED
                        if not released:  # releasing raised before it got there
                            self._become(LoopLife.ENDED)
                    if not released:
                        self._answer_leftovers()
                finally:
                    self._signal_ended()

    def _turn(self) -> None:
        if self._injected_fault is not None:
            raise self._injected_fault
        deadline = self._machine.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if self._lingering:
            timeout = min(timeout if timeout is not None else 1.0, _LINGERING_POLL_SECONDS)
        ready: set[int] = set(wait(self._watched(), timeout))  # type: ignore[arg-type]
        self.drain_cancels()
        self.drain_wakeups(ready)
        self.deliver_replies(ready)
        self.handle_exits(ready)
        self.fire_deadlines(deadline)
        self.flush_sends()
        if self._decoded_errors:  # now that the frames that decoded them have returned
            for error in self._decoded_errors:
                _pickling.release_frames(error)
            self._decoded_errors.clear()

    def _watched(self) -> list[int]:
        assert self._wakeup is not None
        fds = [self._wakeup.reader]
        for worker in self._workers.values():
            fds.append(worker.sentinel)
            if worker.watch_replies:
                fds.append(worker.reader.fd)
        return fds

    def drain_wakeups(self, ready: set[int]) -> None:
        assert self._wakeup is not None
        if self._wakeup.reader not in ready:
            return
        self._wakeup.drain()  # before reading the queue, so no wake() is lost
        unscheduled = False  # submissions queued, to be sent in one pass
        for command in self._take_commands():
            if isinstance(command, Submit):
                machine = self._machine
                for record in command.records:
                    if record.future.cancelled() or machine.closed:
                        self._refuse(record)  # it never queues
                        continue
                    self._counters.submitted += 1
                    task_id = record.info.task_id
                    self._tasks[task_id] = record
                    if actions := machine.submit(task_id, frame_bytes=record.frame_bytes,
                                                 timeout=record.timeout, schedule=False):
                        self._perform(actions)  # (a broken pool fails it at once)
                    unscheduled = True
                continue
            if unscheduled:
                self._perform(self._machine.schedule())
                unscheduled = False
            if isinstance(command, Sync):
                self.drain_cancels()  # those a caller made before asking
                self._publish_census()
                command.done.set()
            elif isinstance(command, Shutdown):
                self._perform(self._machine.shutdown(cancel_futures=command.cancel_futures))
            elif isinstance(command, StopTask):
                self._perform(self._machine.stop_task(command.task_id))
            else:
                self._perform(self._machine.terminate(command.signum))
        if unscheduled:
            self._perform(self._machine.schedule())

    def drain_cancels(self) -> None:
        """Take the tasks their callers cancelled out of the queue (all in one pass)."""
        if self._cancels.empty():
            return
        task_ids = []
        while True:
            try:
                task_ids.append(self._cancels.get_nowait())
            except queue.Empty:
                break
        self._perform(self._machine.callers_cancelled(task_ids))

    def _take_commands(self) -> Iterator[Command]:
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def deliver_replies(self, ready: set[int]) -> None:
        for index, worker in list(self._workers.items()):
            if worker.reader.fd in ready:
                self._read_worker(index, worker)

    def handle_exits(self, ready: set[int]) -> None:
        for index, worker in list(self._workers.items()):
            if worker.sentinel in ready:
                self._read_worker(index, worker)  # replies before deaths, to the last byte
                self._worker_gone(index, worker)

    def fire_deadlines(self, due: float | None) -> None:
        """Tick the machine if what was due first when this turn began (``due``) has
        come. A deadline set during the turn lies after the moment it was set, and the
        next turn's wait ends by then, so it is not missed; ticking every turn would cost
        passes over the slots for every batch of replies."""
        if due is not None and time.monotonic() >= due:
            self._perform(self._machine.tick())
        if self._lingering:
            self._check_lingering_groups()

    def _check_lingering_groups(self) -> None:
        now = time.monotonic()
        for group, give_up_at in list(self._lingering.items()):
            left = _teardown.live_group_members(group)
            if not left:
                del self._lingering[group]
            elif now >= give_up_at:
                del self._lingering[group]
                logger.error("%s: processes %s of a worker's process group %d are still "
                             "running %g s after SIGKILL; giving up on them", self.name,
                             left, group, self._timeouts.kill)

    # -- replies and exits ----------------------------------------------------------------------

    def _read_worker(self, index: int, worker: WorkerHandle) -> None:
        if worker.misbehaved:
            return  # the machine called it misbehaving: nothing more is read from it
        replies: list[tuple[int, object]] = []  # told to the machine together, in order
        for frame in worker.read():
            kind = frame.kind
            try:
                if kind is Kind.RESULT or kind is Kind.RAISED:
                    outcome = _pickling.decode_outcome(frame)
                    if not outcome[0]:
                        self._decoded_errors.append(outcome[1])
                    replies.append((frame.task_id, outcome))
                    continue
                if self._replies_arrived(index, worker, replies):  # what came before first
                    return
                actions = self._frame_arrived(index, worker, frame)
            except _frames.MalformedFrame as exc:
                if self._replies_arrived(index, worker, replies):
                    return
                actions = self._machine.worker_misbehaved(
                    index, f"a {kind.name} frame that is not a reply ({exc})")
            self._perform(actions)
            if worker.misbehaved:
                return
        if self._replies_arrived(index, worker, replies):
            return
        if worker.reader.error:  # after those frames, bytes that are not a frame
            self._perform(self._machine.worker_misbehaved(index, worker.reader.error))

    def _replies_arrived(self, index: int, worker: WorkerHandle,
                         replies: list[tuple[int, object]]) -> bool:
        """Tell the machine the replies gathered (if any), and empty the list; True if the
        worker turned out to misbehave, so that nothing more is read from it."""
        if not replies:
            return False
        actions = self._machine.tasks_replied(index, replies)
        replies.clear()
        # Those it accepted (after one out of turn, none is believed; such replies were
        # decoded all the same, being read in the same batch: the worker is killed next).
        worker.tasks_run += sum(type(action) is _actions.Resolve for action in actions)
        self._perform(actions)
        return bool(worker.misbehaved)

    def _frame_arrived(self, index: int, worker: WorkerHandle, frame: Frame
                       ) -> list[_actions.Action]:
        """Tell the machine what a frame other than a reply says, decoded here, where it
        arrived. Raises MalformedFrame (before telling anything) if its body is not what
        its kind says."""
        if frame.kind is Kind.READY:
            return self._machine.worker_ready(index, pipelining=worker.reclaim_fd is not None)
        if frame.kind is Kind.INIT_FAILED:  # (kept for its exit, which says it failed to start)
            worker.start_error = _pickling.decode_exception(frame.body)
            self._decoded_errors.append(worker.start_error)
            return self._machine.worker_init_failed(index)
        if frame.kind is Kind.OVER_MEMORY:
            if len(frame.body) != 8:
                raise _frames.MalformedFrame(f"{len(frame.body)} bytes, not 8")
            logger.info("%s: worker pid %d uses %d bytes, above max_memory_per_child; "
                        "replacing it after this task", self.name, worker.pid,
                        int.from_bytes(frame.body, "big"))
            return self._machine.worker_over_memory(index)
        raise _frames.MalformedFrame(f"a {frame.kind.name} frame carries no outcome")

    def _worker_gone(self, index: int, worker: WorkerHandle) -> None:
        exited = worker.finish()
        del self._workers[index]
        self._publish_processes()
        if exited.exitcode is None:
            logger.error("%s: worker pid %d exited but could not be reaped", self.name,
                         exited.pid)
            self._abandoned.append(worker)
        if exited.group_left:  # SIGKILLed with the worker; they may take a moment to go
            self._lingering[exited.pid] = time.monotonic() + self._timeouts.kill
        self._perform(self._machine.worker_exited(
            index, unread_bytes=exited.unread_task_bytes, exited=exited,
            lost_track=bool(exited.ended_because)))

    def _departed(self, action: _actions.WorkerGone) -> None:
        """Count and log a worker's exit as the machine says it left."""
        exited: Exit = action.exited
        if action.departure is _actions.Departure.ASKED:
            return  # the pool was ending it: not a death
        self._counters.worker_died(exited.exitcode)
        if action.departure is _actions.Departure.AT_START:
            self._start_failures.worker_ended(exited.start_error, exited)
        elif action.departure is _actions.Departure.IDLE:
            logger.warning("%s: idle worker pid %d died (%s); replacing it%s", self.name,
                           exited.pid, describe_exit(exited.exitcode),
                           f". {exited.ended_because}" if exited.ended_because else "")

    # -- actions -------------------------------------------------------------------------------

    def _perform(self, actions: list[_actions.Action]) -> None:
        """Carry out actions in order (and those they lead to, after them)."""
        work = list(actions)
        for action in work:  # (what they lead to is appended: the loop reaches it too)
            # The two that every task causes, first and without a call.
            if type(action) is _actions.Resolve:
                self._resolve(action)
            elif type(action) is _actions.Send:
                if more := self._send(action.index, self._tasks[action.task_id]):
                    work += more
            elif more := self._perform_one(action):
                work += more

    def _resolve(self, action: _actions.Resolve) -> None:
        """Deliver a reply to its future (and count how the task ended)."""
        record = self._tasks.pop(action.task_id)
        ok, value = action.outcome
        self._count_end(record, Outcome.COMPLETED if ok else Outcome.FAILED)
        resolve(record.future, value if ok else None, None if ok else value)

    def _log_death(self, error: WorkerDied) -> None:
        """One WARNING per worker that died while running a task (the caller may never
        look at the future: a fire-and-forget submit), with the facts in ``extra`` for
        structured handlers. (An idle worker's death is logged in ``_departed``; a
        timeout or a stop, which the pool itself caused, is not a death to warn of.)"""
        logger.warning(
            "%s: worker pid %d died (%s) while running %s; that task failed with "
            "WorkerDied", self.name, error.pid, describe_exit(error.exitcode),
            error.task.describe(),
            extra={"pool_event": "worker_died", "pool_name": self.name,
                   "pool_worker_pid": error.pid, "pool_exitcode": error.exitcode,
                   "pool_signal": error.signal_name, "pool_task": error.task.describe(),
                   "pool_task_id": error.task.task_id})

    def _count_end(self, record: Submission, outcome: Outcome) -> None:
        """Count how a task that ran ended (for ``stats()``): a task its caller stopped
        while it ran ends cancelled, whatever came back, so it counts as stopped."""
        self._counters.ended(Outcome.STOPPED if record.future._stop_requested else outcome)

    def _perform_one(self, action: _actions.Action) -> list[_actions.Action]:
        if isinstance(action, _actions.Send):
            return self._send(action.index, self._tasks[action.task_id])
        if isinstance(action, _actions.Resolve):
            self._resolve(action)
        elif isinstance(action, _actions.Fail):
            self._fail(action)
        elif isinstance(action, _actions.WorkerGone):
            self._departed(action)
        elif isinstance(action, _actions.Misbehaved):
            worker = self._workers[action.index]
            worker.misbehaved = action.reason
            logger.error("%s: worker pid %d sent %s; killing it", self.name, worker.pid,
                         action.reason)
        elif isinstance(action, (_actions.Cancel, _actions.Stopped)):
            # Ends cancelled even if it was already marked running: a task taken back
            # from a worker's pipe unread, then cancelled by shutdown or a stop.
            record = self._tasks.pop(action.task_id)
            ran = isinstance(action, _actions.Stopped) and action.ran
            self._counters.ended(Outcome.STOPPED if ran else Outcome.CANCELLED)
            record.future._end_cancelled()
        elif isinstance(action, _actions.Spawn):
            return self._spawn(action.index)
        elif isinstance(action, _actions.Reclaim):
            taken_back = self._workers[action.index].reclaim()
            return self._machine.tasks_reclaimed(action.index, taken_back)
        elif isinstance(action, (_actions.AskToExit, _actions.Signal, _actions.DumpStack)):
            # To end the slot's worker; there may be none: a start that failed later in the
            # same batch of actions (the machine asked a STARTING slot to stop, then heard
            # that its start failed: see ``StateMachine.spawn_failed``).
            ending = self._workers.get(action.index)
            if ending is None:
                pass
            elif isinstance(action, _actions.AskToExit):
                ending.close_task_pipe()
            elif isinstance(action, _actions.Signal):
                ending.signal(action.signum)
            else:
                ending.dump_stack()
        elif isinstance(action, _actions.Unreaped):
            self._abandon(action.index)
        elif isinstance(action, _actions.Broken):
            with self._lock:
                self.broken_error = self._start_failures.error(_state.MAX_START_FAILURES)
        else:
            raise AssertionError(f"unknown action {action!r}")
        return []

    def _fail(self, action: _actions.Fail) -> None:
        """Fail a task with the error its cause calls for, and count how it ended."""
        record = self._tasks.pop(action.task_id)
        cause = action.cause
        outcome = Outcome.FAILED
        if cause is FailCause.BROKEN:  # Broken came first and set the error
            assert self.broken_error is not None
            error = copy_error(self.broken_error)
        elif cause is FailCause.REFUSED:
            error = self._start_failures.refused_error(self._machine.refused_starts)
        elif cause is FailCause.MISBEHAVED:
            assert action.index is not None
            error = WorkerProtocolError(
                f"worker pid {self._workers[action.index].pid} sent bytes that are not a "
                f"reply while running {record.info.describe()}: {action.reason}")
        else:
            error = failure(action, record.info)
            if isinstance(error, WorkerDied):
                self._log_death(error)
            if cause is FailCause.TIMED_OUT:
                outcome = Outcome.TIMED_OUT
            elif cause is FailCause.TERMINATED:
                outcome = Outcome.STOPPED
        self._count_end(record, outcome)
        resolve(record.future, None, error)

    def _refuse(self, record: Submission) -> None:
        """End a submission the loop will not queue: one its caller cancelled before the
        loop saw it (it ends cancelled, and ``wait`` hears of it), or one that reached the
        loop after the pool closed (a caller queued it just as a broken pool ended by
        itself, before it could see ``broken_error``) or failed (with ``broken_error``)."""
        self._counters.submitted += 1
        self._end_unrun(record, copy_error(self.broken_error) if self.broken_error is not None
                        else RuntimeError("cannot schedule new futures after shutdown"))

    def _end_unrun(self, record: Submission, error: BaseException) -> None:
        """End a task that will never run: cancelled if its caller cancelled it (so that
        ``wait`` and ``as_completed`` hear of it), else failed with ``error``."""
        if record.future.cancelled():
            self._counters.ended(Outcome.CANCELLED)
            record.future._end_cancelled()
        else:
            self._counters.ended(Outcome.FAILED)
            resolve(record.future, None, error)

    def _answer_leftovers(self) -> None:
        """Once the loop has failed or ended, answer every command still queued: nothing
        will act on them (a ``Sync`` is released, a ``Submit`` refused)."""
        for command in self._take_commands():
            if isinstance(command, Sync):
                command.done.set()
            elif isinstance(command, Submit):
                for record in command.records:
                    self._refuse(record)

    def _abandon(self, index: int) -> None:
        """The worker outlived SIGKILL's grace (stuck in the kernel): report it by pid, free
        its slot, and try once more to reap it when the pool ends."""
        worker = self._workers.pop(index)
        self._publish_processes()
        logger.error("%s: worker pid %d is still alive %g s after SIGKILL; giving up on it "
                     "(its slot gets a new worker)", self.name, worker.pid, self._timeouts.kill)
        exited = worker.abandon()
        self._abandoned.append(worker)
        self._perform(self._machine.worker_exited(
            index, unread_bytes=exited.unread_task_bytes, exited=exited,
            lost_track=bool(exited.ended_because)))

    def _send(self, index: int, record: Submission) -> list[_actions.Action]:
        if not record.marked_running:
            if not record.future.set_running_or_notify_cancel():
                self._counters.ended(Outcome.CANCELLED)
                self._tasks.pop(record.info.task_id)
                return self._machine.send_cancelled(index, record.info.task_id)
            record.marked_running = True
        self._workers[index].send(record.info.task_id, record.body,  # written by flush_sends
                                 record.frame_bytes)
        return []

    def flush_sends(self) -> None:
        """Write every frame queued this turn (so replies read in one batch are answered in
        one batch), after collecting the threads that finished writing a large frame."""
        for index, worker in list(self._workers.items()):
            if worker.writer is not None and (failed := worker.collect_writer()) is not None:
                self._perform(self._machine.send_failed(index, failed))
        while pending := [(index, w) for index, w in self._workers.items()
                          if w.outbox and w.writer is None]:
            for index, worker in pending:
                # Not written: the worker died before reading them, so they never started;
                # its sentinel follows. Requeued last-first, so that they keep their order.
                for task_id in reversed(worker.flush()):
                    self._perform(self._machine.send_failed(index, task_id))

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.wake()

    def _spawn(self, index: int) -> list[_actions.Action]:
        assert self._lifeline is not None
        inherited = None
        if self._fork:  # a forked child holds copies of everything: say what to close
            inherited = (self._lifeline[1], *self._wakeup_fds(),
                         *(fd for w in self._workers.values() for fd in w.parent_fds()))
        else:  # the worker imports the main script again: it must still be named
            keep_main_importable()
        try:
            self._workers[index] = WorkerHandle.start(
                self._ctx, f"{self.name}-worker-{index}", lifeline_fd=self._lifeline[0],
                initializer=self._initializer, max_tasks=self._max_tasks,
                max_memory=self._max_memory, inherited_fds=inherited,
                on_write_done=self._wake)
        except Exception as exc:
            if is_refusal(exc):
                self._counters.starts_refused += 1
                self._start_failures.refused(exc, self._machine.refused_starts + 1)
                return self._machine.spawn_refused(index)
            self._start_failures.spawn_raised(exc)
            return self._machine.spawn_failed(index)
        self._counters.workers_started += 1
        self._publish_processes()
        return []

    def _publish_census(self) -> None:
        """Publish the census and the stats (on a caller's ``Sync``, and at the end)."""
        failed = self._life is LoopLife.FAILED  # the machine's records describe nothing
        queued, sent = self.census = (0, 0) if failed else self._machine.census()
        now = time.monotonic()
        workers = []
        for index, worker in sorted(self._workers.items()):
            task_id = None if failed else self._machine.running_task(index)
            started = None if task_id is None else self._machine.started_at(task_id)
            workers.append(WorkerStats(
                pid=worker.pid, tasks_run=worker.tasks_run,
                current_task=None if task_id is None else self._tasks[task_id].info,
                running_for=None if started is None else now - started, rss=None))
        running = 0 if failed else self._machine.running_count()
        self.stats = self._counters.snapshot(queued + sent - running, running, tuple(workers))

    def _publish_processes(self) -> None:
        self.processes = {w.pid: w.process for w in self._workers.values()
                          if w.process is not None}

    def _wakeup_fds(self) -> tuple[int, ...]:
        return self._wakeup.fds if self._wakeup is not None else ()

    # -- failure and release ------------------------------------------------------------------

    def _fail_everything(self, cause: BaseException) -> None:
        logger.critical("%s: internal error; failing every pending task", self.name,
                        exc_info=cause)
        error = PoolInternalError(f"the pool's dispatcher failed: {format_error(cause)}")
        error.__cause__ = cause
        with self._lock:
            self.broken_error = error
            self._become(LoopLife.FAILED)  # (the machine's records no longer describe anything)
        for record in self._tasks.values():
            self._end_unrun(record, copy_error(error))
        self._tasks.clear()
        self._answer_leftovers()
        for worker in self._workers.values():
            worker.signal(signal.SIGKILL)

    def _release(self) -> None:
        """Reap every worker left (only after a failure) and close every descriptor."""
        for index, worker in list(self._workers.items()):
            if worker.finish(sentinel_fired=False).exitcode is None:
                logger.error("%s: worker pid %d could not be reaped", self.name, worker.pid)
                self._abandoned.append(worker)
            del self._workers[index]
        self._publish_processes()
        self._publish_census()
        for worker in self._abandoned:  # one last try; a process stuck for good stays named
            if not worker.reap_abandoned(timeout=0.1):
                logger.error("%s: worker pid %d was never confirmed gone", self.name, worker.pid)
        self._abandoned.clear()
        assert self._wakeup is not None and self._lifeline is not None
        with self._lock:
            self._become(LoopLife.ENDED)
        self._answer_leftovers()
        self._wakeup.close()
        _teardown.close_fds(*self._lifeline)
        self._callbacks.close()
        _exit.forget(self)

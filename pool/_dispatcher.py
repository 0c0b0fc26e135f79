"""The dispatcher: one thread that owns every worker process, pipe and in-flight task.

::

 caller threads                   dispatcher thread "pool-dispatcher-N"       worker processes
 ──────────────                   ─────────────────────────────────────       ────────────────
 Dispatcher.submit(record)        _run: while not machine.closed: _turn()      worker_main:
   Submit ─► _commands ─►          ready = wait([_wakeup.reader,                 read_frame(CALL)
   _wakeup.wake()                             *reply fds, *sentinels],           run fn(*args)
                                              timeout=next deadline)             write_frame(RESULT
 future.result() ◄── _resolve ◄─   drain_wakeups   (Submit, Shutdown)                   | RAISED)
 done-callbacks ◄── CallbackRunner deliver_replies (FrameReader per worker)
 (own thread)                      handle_exits    (sentinel → WorkerDied)     _watch_parent:
                                   fire_deadlines  (stop escalation)             lifeline hang-up
                                   _perform(actions of the StateMachine:         → killpg, exit
                                     Spawn, Send, Resolve, Fail*, Stop, Signal)

Owns: the ``StateMachine``, the task records, the worker processes with their pipes,
sentinels and crash-report files, the pool's lifeline pipe, and the wakeup handle.
Runs in: the dispatcher thread, except the methods marked "caller thread".
Guarantees:
- replies already written by a worker are delivered before its exit is handled, so a task
  that returned before its worker died succeeds;
- no user code runs here: callbacks go to the ``CallbackRunner``, and messages that repr
  user objects are built lazily by the exceptions themselves;
- the loop ends in a firewall: if it raises, every unresolved future gets
  ``PoolInternalError`` chained to the cause, every worker is killed, and later submits
  raise it;
- a worker's exit closes all four of its descriptors and reaps it, so nothing accumulates.
Assumes: callers enqueue commands only through ``submit`` and ``shutdown``; the thread is
the only reader and writer of every attribute not marked as shared.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import signal
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable

from . import _state, _teardown, _wire
from ._errors import (InitializerError, PoolInternalError, TaskInfo, WorkerDied,
                      WorkerProtocolError, describe_exit)
from ._futures import CallbackRunner, PoolFuture, install_on_dispatcher_thread
from ._state import StateMachine
from ._wakeup import Wakeup
from ._wire import Frame, FrameReader, Kind
from ._worker import InheritedFd, WorkerSetup, worker_main

logger = logging.getLogger("pool")

_dispatcher_numbers = itertools.count(1)

# Frames this small can wait in a worker's pipe behind a running task without ever making
# the dispatcher block on the write (a pipe holds 64 KiB on Linux).
PIPELINE_MAX_BYTES = 16 * 1024
# How long a worker whose sentinel fired may take to become reapable.
_REAP_SECONDS = 5.0


@dataclass(eq=False)
class TaskRecord:
    """A submitted task as the dispatcher tracks it."""

    info: TaskInfo
    future: PoolFuture
    body: bytes              # the CALL frame's body
    marked_running: bool = False
    outcome: tuple[bool, Any] | None = None


@dataclass(frozen=True)
class Submit:
    record: TaskRecord


@dataclass(frozen=True)
class Shutdown:
    cancel_futures: bool


class _Worker:
    """One live worker process and the parent's ends of its descriptors."""

    def __init__(self, process: Any, task_fd: int, reply_fd: int, crash_fd: int) -> None:
        self.process = process
        self.pid: int = process.pid
        self.sentinel: int = process.sentinel
        self.task_fd: int | None = task_fd
        self.reader = FrameReader(reply_fd)
        self.crash_fd = crash_fd
        self.start_error: BaseException | None = None  # from an INIT_FAILED frame

    def parent_fds(self) -> list[int]:
        fds = [self.reader.fd, self.crash_fd, self.sentinel]
        return fds + ([self.task_fd] if self.task_fd is not None else [])

    def close_task_pipe(self) -> None:
        if self.task_fd is not None:
            _teardown.close_fds(self.task_fd)
            self.task_fd = None


class Dispatcher:
    def __init__(self, *, max_workers: int, mp_context: Any, initializer: bytes | None,
                 max_tasks_per_child: int | None, pipeline_depth: int = 1,
                 timeouts: _state.Timeouts = _state.Timeouts()) -> None:
        self.name = f"pool-dispatcher-{next(_dispatcher_numbers)}"
        self._ctx = mp_context
        self._fork = mp_context.get_start_method() == "fork"
        self._initializer = initializer
        self._max_tasks = max_tasks_per_child
        self._machine = StateMachine(max_workers, time.monotonic,
                                     max_tasks_per_child=max_tasks_per_child,
                                     pipeline_depth=pipeline_depth, timeouts=timeouts)
        self._tasks: dict[int, TaskRecord] = {}
        self._workers: dict[int, _Worker] = {}  # slot index -> live worker
        self._last_start_failure: str = ""
        self._last_start_cause: BaseException | None = None
        self._callbacks = CallbackRunner(f"{self.name}-callbacks")
        self._injected_fault: BaseException | None = None  # tests: make the loop fail
        # Shared with caller threads: guarded by _lock (never taken by the loop itself
        # except to publish a failure).
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[Submit | Shutdown] = queue.SimpleQueue()
        self._task_ids = itertools.count(1)
        self._owner_pid = os.getpid()
        self._closing = False
        self.broken_error: BaseException | None = None
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
            raise _fresh(self.broken_error)
        if self._closing:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if _interpreter_exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    def submit(self, make_info: Callable[[int], TaskInfo], body: bytes) -> PoolFuture:
        """Queue one encoded call (caller thread). Raises if the pool cannot take it."""
        future = PoolFuture()
        with self._lock:
            self.check_open()
            self._start_thread()
            task_id = next(self._task_ids)
            self._commands.put(Submit(TaskRecord(make_info(task_id), future, body)))
        assert self._wakeup is not None
        self._wakeup.wake()
        return future

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        """Ask the loop to finish (caller thread); with ``wait``, until it has."""
        with self._lock:
            started = self._thread is not None
            if started and (not self._closing or cancel_futures):
                self._commands.put(Shutdown(cancel_futures))
            self._closing = True
        if started:
            assert self._wakeup is not None and self._thread is not None
            self._wakeup.wake()
            if wait and self._thread is not threading.current_thread():
                self._thread.join()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _start_thread(self) -> None:
        if self._thread is not None:
            return
        self._wakeup = Wakeup()
        self._lifeline = os.pipe()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        _live_dispatchers.add(self)
        _register_exit_hook()

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        install_on_dispatcher_thread(self._callbacks)
        try:
            while not self._machine.closed:
                self._turn()
        except BaseException as exc:  # the firewall: never a hang, never a silent death
            self._fail_everything(exc)
        finally:
            self._release()

    def _turn(self) -> None:
        if self._injected_fault is not None:
            raise self._injected_fault
        deadline = self._machine.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready: set[int] = set(wait(self._watched(), timeout))  # type: ignore[arg-type]
        self.drain_wakeups(ready)
        self.deliver_replies(ready)
        self.handle_exits(ready)
        self.fire_deadlines()

    def _watched(self) -> list[int]:
        assert self._wakeup is not None
        fds = [self._wakeup.reader]
        for worker in self._workers.values():
            fds.append(worker.sentinel)
            if not (worker.reader.eof or worker.reader.error):
                fds.append(worker.reader.fd)  # at end of file it would be ready forever
        return fds

    def drain_wakeups(self, ready: set[int]) -> None:
        assert self._wakeup is not None
        if self._wakeup.reader not in ready:
            return
        self._wakeup.drain()  # before reading the queue, so no wake() is lost
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, Submit):
                record = command.record
                self._tasks[record.info.task_id] = record
                self._perform(self._machine.submit(
                    record.info.task_id, pipelinable=len(record.body) <= PIPELINE_MAX_BYTES))
            else:
                self._perform(self._machine.shutdown(cancel_futures=command.cancel_futures))

    def deliver_replies(self, ready: set[int]) -> None:
        for slot, worker in list(self._workers.items()):
            if worker.reader.fd in ready:
                self._read_worker(slot, worker)

    def handle_exits(self, ready: set[int]) -> None:
        for slot, worker in list(self._workers.items()):
            if worker.sentinel in ready:
                self._read_worker(slot, worker)  # replies before deaths, to the last byte
                self._worker_gone(slot, worker)

    def fire_deadlines(self) -> None:
        self._perform(self._machine.tick())

    # -- replies and exits ----------------------------------------------------------------------

    def _read_worker(self, slot: int, worker: _Worker) -> None:
        reader = worker.reader
        if reader.eof or reader.error:
            return
        for frame in reader.read_available():
            if not self._accept_frame(slot, worker, frame):
                reader.error = f"unexpected {frame.kind.name} frame for task {frame.task_id}"
                break
        if reader.error:
            logger.error("%s: worker pid %d sent %s; killing it", self.name, worker.pid,
                         reader.error)
            self._perform(self._machine.worker_misbehaved(slot))

    def _accept_frame(self, slot: int, worker: _Worker, frame: Frame) -> bool:
        """Act on one frame; False if the frame makes no sense in the slot's state."""
        machine_slot = self._machine.slots[slot]
        if frame.kind is Kind.READY:
            if machine_slot.state is not _state.SlotState.STARTING:
                return machine_slot.state is _state.SlotState.STOPPING
            self._perform(self._machine.worker_ready(slot))
        elif frame.kind is Kind.INIT_FAILED:
            worker.start_error = _wire.decode_exception(frame.body)
        else:
            in_flight = machine_slot.in_flight
            if not in_flight or in_flight[0] != frame.task_id:
                return False
            self._tasks[frame.task_id].outcome = _wire.decode_outcome(frame)
            self._perform(self._machine.task_replied(slot, frame.task_id))
        return True

    def _worker_gone(self, slot: int, worker: _Worker) -> None:
        # Its process group first, while the unreaped leader still pins the group id.
        _teardown.signal_worker(worker.pid, signal.SIGKILL)
        # The sentinel can report the exit a moment before the kernel lets the process be
        # reaped; the join waits out that moment (the process is already exiting).
        exitcode = _teardown.reap(worker.process, timeout=_REAP_SECONDS)
        crash_report = _teardown.read_crash_report(worker.crash_fd)
        unstarted = self._count_unstarted(slot, worker)
        self._close_worker(slot, worker)
        running = self._machine.slots[slot].in_flight
        state = self._machine.slots[slot].state
        if state is _state.SlotState.STARTING:
            self._note_start_failure(worker, exitcode, crash_report)
        elif not running and state is not _state.SlotState.STOPPING:
            logger.warning("%s: idle worker pid %d died (%s); replacing it", self.name,
                           worker.pid, describe_exit(exitcode))
        self._perform(self._machine.worker_exited(slot, unstarted=unstarted),
                      death=(worker.pid, exitcode, crash_report))

    def _count_unstarted(self, slot: int, worker: _Worker) -> int:
        """How many of the tasks last sent to a dead worker it never finished reading.

        A worker can die just after sending a reply, when the dispatcher has already
        written it the next task: bytes left in its task pipe prove that task never ran.
        """
        if worker.task_fd is None:
            return 0
        unread = _teardown.unread_bytes(worker.task_fd)
        count, later_frames = 0, 0
        for task_id in reversed(self._machine.slots[slot].in_flight):
            if unread <= later_frames:
                break
            count += 1
            later_frames += _wire.HEADER.size + len(self._tasks[task_id].body)
        return count

    def _note_start_failure(self, worker: _Worker, exitcode: int | None,
                            crash_report: str | None) -> None:
        cause = worker.start_error
        if cause is not None:
            text = getattr(cause, "remote_traceback", None) or "".join(
                traceback.format_exception(cause))
            self._last_start_failure = f"the initializer raised:\n{text.rstrip()}"
        else:
            self._last_start_failure = (f"worker pid {worker.pid} ended while starting "
                                        f"({describe_exit(exitcode)})")
            if crash_report:
                self._last_start_failure += f"\nCrash report:\n{crash_report}"
        self._last_start_cause = cause
        logger.warning("%s: worker failed to start: %s", self.name, self._last_start_failure)

    def _close_worker(self, slot: int, worker: _Worker) -> None:
        worker.close_task_pipe()
        _teardown.close_fds(worker.reader.fd, worker.crash_fd)
        del self._workers[slot]

    # -- actions -------------------------------------------------------------------------------

    def _perform(self, actions: list[_state.Action],
                 death: tuple[int, int | None, str | None] | None = None) -> None:
        """Carry out actions in order; ``death`` is (pid, exit code, crash report) of the
        worker whose exit produced them, for ``FailDied``."""
        work = list(actions)
        while work:
            action = work.pop(0)
            if isinstance(action, _state.FailDied):
                assert death is not None
                record = self._tasks.pop(action.task_id)
                _resolve(record.future, None, WorkerDied(death[0], death[1], record.info,
                                                         death[2]))
            else:
                work += self._perform_one(action)

    def _perform_one(self, action: _state.Action) -> list[_state.Action]:
        if isinstance(action, _state.Send):
            return self._send(action.slot, self._tasks[action.task_id])
        if isinstance(action, _state.Resolve):
            record = self._tasks.pop(action.task_id)
            assert record.outcome is not None
            ok, value = record.outcome
            _resolve(record.future, value if ok else None, None if ok else value)
        elif isinstance(action, _state.FailMisbehaved):
            record = self._tasks.pop(action.task_id)
            pid = self._workers[action.slot].pid
            _resolve(record.future, None, WorkerProtocolError(
                f"worker pid {pid} sent bytes that are not a reply while running "
                f"{record.info.describe()}: {self._workers[action.slot].reader.error}"))
        elif isinstance(action, _state.FailBroken):
            record = self._tasks.pop(action.task_id)
            _resolve(record.future, None, self._initializer_error())
        elif isinstance(action, _state.Cancel):
            self._tasks.pop(action.task_id).future.cancel()
        elif isinstance(action, _state.Spawn):
            return self._spawn(action.slot)
        elif isinstance(action, _state.Stop):
            self._workers[action.slot].close_task_pipe()
        elif isinstance(action, _state.Signal):
            _teardown.signal_worker(self._workers[action.slot].pid, action.signum)
        elif isinstance(action, _state.Unreaped):
            logger.error("%s: worker pid %d is still alive after SIGKILL; giving up on it",
                         self.name, self._workers[action.slot].pid)
        elif isinstance(action, _state.Broken):
            with self._lock:
                self.broken_error = self._initializer_error()
        else:
            raise AssertionError(f"unknown action {action!r}")
        return []

    def _send(self, slot: int, record: TaskRecord) -> list[_state.Action]:
        if not record.marked_running:
            if not record.future.set_running_or_notify_cancel():
                self._tasks.pop(record.info.task_id)
                return self._machine.task_cancelled(slot, record.info.task_id)
            record.marked_running = True
        worker = self._workers[slot]
        assert worker.task_fd is not None
        try:
            _wire.write_frame(worker.task_fd, Kind.CALL, record.info.task_id, record.body)
        except BrokenPipeError:
            # It died before reading: the task never started; its sentinel follows.
            return self._machine.send_failed(slot, record.info.task_id)
        return []

    def _spawn(self, slot: int) -> list[_state.Action]:
        assert self._lifeline is not None
        task_r, task_w = os.pipe()
        reply_r, reply_w = os.pipe()
        crash_fd = _teardown.make_crash_file()
        inherited: tuple[int, ...] = ()
        if self._fork:  # a forked child holds copies of everything: say what to close
            inherited = (task_w, reply_r, self._lifeline[1], *self._wakeup_fds(),
                         *(fd for w in self._workers.values() for fd in w.parent_fds()))
        setup = WorkerSetup(task_fd=InheritedFd(task_r), reply_fd=InheritedFd(reply_w),
                            lifeline_fd=InheritedFd(self._lifeline[0]),
                            crash_fd=InheritedFd(crash_fd), parent_pid=os.getpid(),
                            initializer=self._initializer, max_tasks=self._max_tasks,
                            fds_to_close=inherited)
        process = self._ctx.Process(target=worker_main, args=(setup,),
                                    name=f"{self.name}-worker-{slot}")
        try:
            process.start()
        except Exception as exc:
            _teardown.close_fds(task_r, task_w, reply_r, reply_w, crash_fd)
            self._last_start_failure = f"starting the process failed: {_format(exc)}"
            self._last_start_cause = exc
            logger.warning("%s: %s", self.name, self._last_start_failure)
            return self._machine.spawn_failed(slot)
        finally:
            del setup
        _teardown.close_fds(task_r, reply_w)  # the child's ends
        os.set_blocking(reply_r, False)
        self._workers[slot] = _Worker(process, task_w, reply_r, crash_fd)
        return []

    def _wakeup_fds(self) -> tuple[int, ...]:
        return self._wakeup.fds if self._wakeup is not None else ()

    def _initializer_error(self) -> InitializerError:
        error = InitializerError(
            f"workers failed to start {_state.MAX_START_FAILURES} times in a row; the pool "
            f"stopped starting them. Last failure: {self._last_start_failure}")
        error.__cause__ = self._last_start_cause
        return error

    # -- failure and release ------------------------------------------------------------------

    def _fail_everything(self, cause: BaseException) -> None:
        logger.critical("%s: internal error; failing every pending task", self.name,
                        exc_info=cause)
        error = PoolInternalError(f"the pool's dispatcher failed: {_format(cause)}")
        error.__cause__ = cause
        with self._lock:
            self.broken_error = error
        pending: list[TaskRecord] = list(self._tasks.values())
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, Submit):
                pending.append(command.record)
        for record in pending:
            _resolve(record.future, None, _fresh(error))
        self._tasks.clear()
        for worker in self._workers.values():
            _teardown.signal_worker(worker.pid, signal.SIGKILL)

    def _release(self) -> None:
        """Reap every worker left (only after a failure) and close every descriptor."""
        for slot, worker in list(self._workers.items()):
            if _teardown.reap(worker.process, timeout=5.0) is None:
                logger.error("%s: worker pid %d could not be reaped", self.name, worker.pid)
            self._close_worker(slot, worker)
        assert self._wakeup is not None and self._lifeline is not None
        with self._lock:
            self._closing = True
        self._wakeup.close()
        _teardown.close_fds(*self._lifeline)
        self._callbacks.close()
        _live_dispatchers.discard(self)


def _resolve(future: PoolFuture, result: Any, exception: BaseException | None) -> None:
    try:
        if exception is None:
            future.set_result(result)
        else:
            future.set_exception(exception)
    except Exception:  # InvalidStateError: the caller cancelled it while it was queued
        pass


def _fresh(error: BaseException) -> BaseException:
    """A new instance to raise in one more thread, keeping the message and the cause."""
    copy = type(error).__new__(type(error))
    copy.__dict__.update(getattr(error, "__dict__", {}))
    copy.args = error.args
    copy.__cause__ = error.__cause__
    return copy


def _format(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# --- interpreter exit ----------------------------------------------------------------------

_live_dispatchers: weakref.WeakSet[Dispatcher] = weakref.WeakSet()
_interpreter_exiting = False
_exit_hook_registered = False


def _shutdown_all_at_exit() -> None:
    """Keep the stdlib's promise: submitted work finishes before the interpreter exits."""
    global _interpreter_exiting
    _interpreter_exiting = True
    for dispatcher in list(_live_dispatchers):
        dispatcher.shutdown(wait=True, cancel_futures=False)


def _register_exit_hook() -> None:
    global _exit_hook_registered
    if _exit_hook_registered:
        return
    _exit_hook_registered = True
    # Runs before non-daemon threads are joined, as ProcessPoolExecutor's own hook does, so a
    # thread waiting for a result does not hold up the exit.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(_shutdown_all_at_exit)
    except RuntimeError:
        import atexit
        atexit.register(_shutdown_all_at_exit)

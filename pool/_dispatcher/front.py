"""The dispatcher as its callers see it: all that caller threads touch.

Owns: what callers and the loop share: the ``Admission`` (what callers may still do), the
queue of commands and the queue of cancelled task ids, the wakeup handle, ``broken_error``,
what the loop publishes for callers to read (``processes``, ``census``, ``stats``, each
replaced whole, never changed in place) and how callers learn that the loop ended
(``finished``, and a latch); and the ``Loop``, started at the first submit.
Runs in: callers' threads; the methods under "the loop's side" (``commands.Front``) in the
dispatcher thread only.
Guarantees:
- callers hold ``_lock`` only to look at and move the admission and to queue a command; the
  loop holds it only to move the admission and set ``broken_error``. Callers wait on
  latches, in slices, never on anything the loop holds (DESIGN contract 9), and never join
  the thread;
- a command queued while the admission is not ENDED is acted on, or answered once the loop
  has failed or ended (a ``Sync`` released, a ``Submit`` refused); later ones are dropped;
- ``finished`` and the latch are set once, after the admission is ENDED.
Assumes: the loop is the only writer of what is published, and touches nothing here but
the methods under "the loop's side".
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import queue
import signal
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .. import _exit, _shake
from .._core.states import InvalidTransition, Timeouts
from .._errors import TaskInfo, copy_error
from .._callbacks import CallbackRunner
from .._futures import PoolFuture
from .._latch import Latch, join_interruptibly
from .._locks import InterruptSafeLock
from .._counts import Counters
from .._wire import limits
from .._wire.frames import HEADER, Buffers, size_of
from .._worker.main import Initializer
from .commands import (Command, EncodedCall, Shutdown, StopTask, Submission, Submit, Sync,
                       Terminate)
from .loop import Loop
from .wakeup import Wakeup

if TYPE_CHECKING:
    from .._stats import PoolStats

logger = logging.getLogger("pool")

_dispatcher_numbers = itertools.count(1)


class EndedFuture(Future[None]):
    """``Dispatcher.finished``: resolved once the loop has ended, for ``async with`` to
    await. Its lock is an ``InterruptSafeLock``: a caller's thread takes it (``done()``,
    ``add_done_callback()``) and the ending thread needs it, so a Ctrl-C there must not
    leave it taken. Nobody may cancel it: an awaiting coroutine that is cancelled would
    otherwise cancel it through ``asyncio.wrap_future``."""

    def __init__(self) -> None:
        super().__init__()
        self._condition = threading.Condition(InterruptSafeLock())

    def cancel(self) -> bool:
        return False


class Admission(enum.Enum):
    """What callers may still do: whether ``submit`` queues, and whether a command still
    reaches the loop. Moved under ``_lock``, and read under it wherever a decision depends
    on it (``closing`` and ``repr`` read it without).

    The pool's own life (open, broken, draining, terminating, closed) is the state
    machine's ``PoolLife``, which the loop alone reads; this is what a caller needs to know
    without asking the loop. ``broken_error`` is not a state but what ``submit`` raises
    once set (workers cannot start, or the loop failed).
    """

    __hash__ = object.__hash__

    OPEN = "open"        # submit() queues tasks; the loop starts at the first
    CLOSING = "closing"  # shutdown() or a terminate was called: submit() refuses, and the
                         # loop finishes what it has
    FAILED = "failed"    # the loop raised, and failed every future (the firewall)
    ENDED = "ended"      # the loop has let everything go, or never started: commands are
                         # dropped; ``finished`` and the latch are set just after


ADMISSION_TRANSITIONS: dict[Admission, frozenset[Admission]] = {
    # OPEN -> ENDED: a broken pool's machine closes by itself, with no shutdown() called.
    Admission.OPEN: frozenset({Admission.CLOSING, Admission.FAILED, Admission.ENDED}),
    Admission.CLOSING: frozenset({Admission.FAILED, Admission.ENDED}),
    Admission.FAILED: frozenset({Admission.ENDED}),
    Admission.ENDED: frozenset(),
}


class Dispatcher:
    """What the faces call (the executor, the shared pool, the exit hooks, a future's
    ``stop`` and ``cancel``). The work is done by its ``Loop``, on the thread ``name``."""

    def __init__(self, *, max_workers: int, mp_context: Any, initializer: Initializer | None,
                 max_tasks_per_child: int | None, max_memory_per_child: int | None = None,
                 pipeline_depth: int = limits.PIPELINE_DEPTH,
                 timeouts: Timeouts = Timeouts(),
                 idle_timeout: float | None = None) -> None:
        limits.check_pipeline(pipeline_depth)
        self.name = f"pool-dispatcher-{next(_dispatcher_numbers)}"
        self._timeouts = timeouts
        self._lock = InterruptSafeLock()  # callers and the loop take it: see _locks
        self._admission = Admission.OPEN
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue[int] = queue.SimpleQueue()  # see cancelled()
        self._task_ids = itertools.count(1)
        self._owner_pid = os.getpid()
        self._wakeup: Wakeup | None = None
        self._thread: threading.Thread | None = None
        self._callbacks = CallbackRunner(f"{self.name}-callbacks")
        # Resolved once the loop has released everything, at once if it never started.
        # Callers wait for this, never for the thread: on 3.11, a KeyboardInterrupt inside
        # Thread.join() can leave a thread that still runs marked as stopped (the bpo-45274
        # handling), and a second join() would then return at once.
        self.finished = EndedFuture()
        # The same fact for callers that wait in a thread: a latch, which a Ctrl-C in the
        # wait cannot leave locked for the loop to block on (see _latch.Latch).
        self._ended = Latch()
        self.broken_error: BaseException | None = None
        # Published by the loop: the live workers' Process objects by pid (the executor's
        # ``_processes``), and the machine's census and the stats as of a caller's last
        # ``snapshot`` (for ``repr`` and ``stats()``; not every turn: nothing else reads
        # them).
        self.processes: dict[int, Any] = {}
        self.census = (0, 0)
        self._stats: PoolStats | None = None  # None: nothing published yet
        # Let go of once the loop has ended: it holds this object, and without the cycle
        # a pool is freed as soon as its last user lets go of it.
        self._loop: Loop | None = Loop(self, self._callbacks,
                                       max_workers=max_workers, mp_context=mp_context,
                                       initializer=initializer,
                                       max_tasks_per_child=max_tasks_per_child,
                                       max_memory_per_child=max_memory_per_child,
                                       pipeline_depth=pipeline_depth, timeouts=timeouts,
                                       idle_timeout=idle_timeout)

    # -- what callers call ----------------------------------------------------------------

    def check_open(self) -> None:
        """Raise what ``submit`` would raise now (call under ``_lock`` to be sure, or before
        pickling, to fail early)."""
        if os.getpid() != self._owner_pid:
            # A fork() of the parent copied this object but not its dispatcher thread.
            raise RuntimeError(f"this pool belongs to process {self._owner_pid}; a forked "
                               f"child ({os.getpid()}) cannot use it")
        if self.broken_error is not None:
            raise copy_error(self.broken_error)
        if self._admission is not Admission.OPEN:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if _exit.interpreter_exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               body: Buffers, timeout: float | None = None) -> PoolFuture[Any]:
        """Queue one encoded call. Raises if the pool cannot take it."""
        return self.submit_many([(fn, args, kwargs, body)], timeout)[0]

    def submit_many(self, calls: list[EncodedCall], timeout: float | None = None
                    ) -> list[PoolFuture[Any]]:
        """Queue encoded calls ``(fn, args, kwargs, body)``, in order, as one command with
        one wake-up (``map`` submits its input in groups). Raises, queuing none of them,
        if the pool cannot take them."""
        futures: list[PoolFuture[Any]] = []
        submissions = []
        with self._lock:
            self.check_open()
            self._start_thread()
            for fn, args, kwargs, body in calls:
                future: PoolFuture[Any] = PoolFuture()
                task_id = next(self._task_ids)
                future._stopper, future._task_id = self, task_id
                submissions.append(Submission(TaskInfo(task_id, fn, args, kwargs), future,
                                              body, HEADER.size + size_of(body), timeout))
                futures.append(future)
            self._commands.put(Submit(submissions))
        if _shake.on:
            _shake.pause("front.before_wake")
        assert self._wakeup is not None
        self._wakeup.wake()
        return futures

    def live_processes(self, timeout: float = 5.0) -> dict[int, Any]:
        """The live workers by pid once the loop has acted on everything submitted before
        this call: as with the stdlib, which starts workers inside ``submit()``, the
        workers started for those tasks are listed. Waits at most ``timeout`` for the loop
        (on a latch: contract 9)."""
        return self.snapshot(timeout)[0]

    def snapshot(self, timeout: float = 5.0) -> tuple[dict[int, Any], tuple[int, int]]:
        """``(processes, census)`` once the loop has acted on everything queued before this
        call (see ``live_processes``); ``self.stats`` is then as fresh."""
        if os.getpid() != self._owner_pid:
            self._stats = Counters().snapshot(0, 0, ())
            return {}, (0, 0)  # a forked copy of the parent: none of these are its own
        latch = Latch()
        with self._lock:
            waits = (self._thread is not None and self._admission is not Admission.ENDED
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
        """Ask for a task to be stopped (``PoolFuture.stop``)."""
        self._command(StopTask(task_id))

    def cancelled(self, task_id: int) -> None:
        """A caller cancelled this task's future (``PoolFuture.cancel``; any thread, a
        signal handler or a forked copy included: a ``SimpleQueue`` put takes no lock and
        wakes nothing). The loop takes it out of the queue at its next turn, before it
        answers any caller, so ``stats()`` never counts it queued."""
        self._cancels.put(task_id)

    def terminate(self, signum: int, wait: bool) -> None:
        """terminate_workers() / kill_workers(): cancel what has not started, end every
        worker now with ``signum`` (escalating to SIGKILL), and with ``wait``, return once
        every worker is reaped or reported."""
        self.shutdown(wait=False, cancel_futures=True)
        self._command(Terminate(signum))
        if wait:
            self.join()

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        """Ask the loop to finish; with ``wait``, until it has."""
        with self._lock:
            started = self._thread is not None
            if started and (self._admission is Admission.OPEN or cancel_futures):
                self._commands.put(Shutdown(cancel_futures))
            if self._admission is Admission.OPEN:
                self._move_admission(Admission.CLOSING)
            ends_now = not started and self._admission is not Admission.ENDED
            if ends_now:
                self._move_admission(Admission.ENDED)  # nothing ever ran: nothing to wait for
        if ends_now:  # only the thread that ended it: two shutdowns may race here
            self.signal_ended()
        if started:
            assert self._wakeup is not None
            self._wakeup.wake()
            if wait:
                self.join()

    def join(self, callback_timeout: float | None = None) -> None:
        """Wait for the loop to end, then for the callbacks it queued: as with the stdlib,
        whose manager thread runs them, every callback of a resolved future has run when
        shutdown(wait=True) returns. ``callback_timeout`` bounds that second wait, so that
        interpreter exit does not wait forever for a blocked callback.

        A Ctrl-C while waiting for the loop stops waiting for the tasks: the workers are
        terminated (a second Ctrl-C kills them), and once they are gone the
        KeyboardInterrupt goes on. Every wait of a caller comes through here.
        """
        if self._thread is threading.current_thread():
            return
        if self._thread is None:
            if self._ended.is_set:  # shut down before it started: only callbacks may run
                self._callbacks.close()  # (pool.Pool's, of calls that could not be sent)
                self._callbacks.join(callback_timeout)
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
        # The loop's thread told us it ended just before it returns; once it has, no
        # thread of the pool's is left (as the stdlib joins its manager thread). All it
        # does in between is resolve ``finished``, whose callbacks never block. Callers
        # never join the thread while its loop runs (DESIGN, contract 9: a Ctrl-C inside
        # the join can make 3.11 mark it stopped); once the loop has ended, that mark
        # would change nothing.
        join_interruptibly(self._thread)

    def run_later(self, fn: Callable[[], object]) -> None:
        """Runs ``fn()`` on one of the pool's callback threads (``CallbackRunner.call``)."""
        self._callbacks.call(fn)

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
        return self._admission is not Admission.OPEN

    def close_in_forked_child(self) -> None:
        """Runs in a child that some thread of ours forked (``os.register_at_fork``): see
        ``Performer.close_in_forked_child``."""
        if self._loop is not None:
            self._loop.close_in_forked_child()

    def _command(self, command: Command) -> None:
        """Hand the loop a command; dropped once the loop has ended."""
        with self._lock:
            if self._thread is None or self._admission is Admission.ENDED:
                return
            self._commands.put(command)
        if _shake.on:
            _shake.pause("front.before_wake")
        assert self._wakeup is not None
        self._wakeup.wake()

    def _start_thread(self) -> None:
        """Start the loop at the first submit (under ``_lock``). If anything here raises
        (a Ctrl-C inside ``Thread.start()``, no thread could be made), the thread is
        disowned before ``_lock`` is let go: if it began, it sees that and returns without
        running the loop (``Loop._run_if_owned``), and a later submit starts another. So
        never two threads on one loop, and never a shutdown waiting for a thread that
        does not run it."""
        if self._thread is not None:
            return
        assert self._loop is not None, "the loop ended before it started"
        if self._wakeup is None:
            self._wakeup = Wakeup()
        thread = self._loop.new_thread(self._wakeup)
        try:
            self._thread = thread
            _exit.shut_down_at_exit(self)
            thread.start()
        except BaseException:
            self._thread = None  # first: nothing before it checks for signals
            raise

    def _move_admission(self, new: Admission) -> None:
        """Move the admission (under ``_lock``) as ``ADMISSION_TRANSITIONS`` allows."""
        if new not in ADMISSION_TRANSITIONS[self._admission]:
            raise InvalidTransition(f"{self.name}: {self._admission.name} -> {new.name}")
        self._admission = new

    # -- the loop's side (commands.Front): dispatcher thread only ---------------------------

    def owns_loop(self, thread: threading.Thread) -> bool:
        with self._lock:  # held by the starter until it has kept or disowned the thread
            return self._thread is thread

    def take_commands(self) -> Iterator[Command]:
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def take_cancels(self) -> list[int]:
        if self._cancels.empty():
            return []
        task_ids = []
        while True:
            try:
                task_ids.append(self._cancels.get_nowait())
            except queue.Empty:
                return task_ids

    def publish_processes(self, processes: dict[int, Any]) -> None:
        self.processes = processes

    @property
    def stats(self) -> PoolStats:
        """The stats as of a caller's last ``snapshot``."""
        if self._stats is None:
            self._stats = Counters().snapshot(0, 0, ())
        return self._stats

    def publish_census(self, census: tuple[int, int], stats: PoolStats) -> None:
        self.census, self._stats = census, stats

    def pool_broken(self, error: BaseException) -> None:
        with self._lock:
            self.broken_error = error

    def loop_failed(self, error: BaseException) -> None:
        with self._lock:
            self.broken_error = error
            self._move_admission(Admission.FAILED)

    @property
    def failed(self) -> bool:
        return self._admission is Admission.FAILED

    def loop_ended(self) -> bool:
        with self._lock:
            if self._admission is Admission.ENDED:
                return False
            self._move_admission(Admission.ENDED)
            return True

    def signal_ended(self) -> None:
        """Called once, by the thread that moved the admission to ENDED, outside ``_lock``:
        a done-callback of ``finished`` runs here."""
        self._loop = None
        self._ended.set()  # first: threads that wait need nothing a done-callback may hold
        if not self.finished.done():
            self.finished.set_result(None)

    @property
    def ended(self) -> bool:
        """The loop has ended and released everything, or the pool was shut down before
        it started."""
        return self._ended.is_set

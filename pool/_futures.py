"""The futures the pool returns: ``PoolFuture``, and ``failed_future`` for a call that
failed before it was sent.

Owns: each future's state, under the future's own lock.
Runs in: every thread touches futures. The dispatcher thread resolves them; callers wait
on them, cancel and stop them. The callbacks that a result, exception or cancellation set
on the dispatcher thread would trigger go to its ``CallbackRunner`` (``_callbacks``).
Guarantees:
- ``stop()`` is decided at once, under the future's own lock: if it returns True the future
  ends cancelled, even if a result arrives before the worker is killed;
- a caller waiting in ``result()`` or ``exception()`` holds no lock the dispatcher needs:
  it waits on a ``Latch`` (``_latch``). So a Ctrl-C in the wait cannot deadlock the
  dispatcher;
- ``cancel()`` takes only the future's own lock and runs the callbacks after releasing it,
  as the stdlib's does. It tells the pool through a queue that needs no lock;
- the pool's own ``_when_done`` hooks (progress counts) run once, on the resolving thread,
  before the callbacks are handed on: they only put a number on a queue.
Assumes: the stdlib's ``wait`` and ``as_completed`` reach a future only through ``_state``,
``_waiters`` and ``_condition``, which they hold while they look. ``Future``'s callbacks
run through ``_invoke_callbacks()``. Both hold from 3.2 to 3.14; ``tests/test_lifecycle.py``
and ``tests/test_timeouts.py`` pin them.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future, InvalidStateError
from typing import Any, Callable, Generator, TypeGuard, TypeVar

from . import _compat, _shake
from ._callbacks import run_callbacks, runner_of_this_thread
from ._latch import Latch
from ._locks import InterruptSafeLock

T = TypeVar("T")

# Where ``Future`` keeps its state, and in which values (see the class's docstring).
PENDING, RUNNING, CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED = _compat.future_states()
_DONE_STATES = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_CANCELLED_STATES = (CANCELLED, CANCELLED_AND_NOTIFIED)


class PoolFuture(Future[T]):
    """A ``concurrent.futures.Future`` whose callbacks never run on the dispatcher thread,
    and which can stop its task even while it runs (:meth:`stop`). Awaiting it in a
    coroutine works; cancelling that coroutine stops the task. Generic in the task's return
    type, as ``Future`` is: ``submit(fn, ...)`` gives ``PoolFuture[<fn's return type>]``.

    Its state lives where ``Future`` keeps it: ``_state``, ``_result``, ``_exception``,
    ``_waiters``, ``_done_callbacks``. One C lock guards it, ``_lock``. It is an RLock, as
    ``Future``'s is, so a signal handler may ``cancel()`` a future while the stdlib's
    ``wait()`` holds its lock on the same thread; and an ``InterruptSafeLock``, so that a
    Ctrl-C in ``cancel()`` cannot leave it taken for the dispatcher. ``Future.__init__``
    would build a ``threading.Condition`` around it: a dozen Python objects for every task,
    which the cyclic GC then walks. Here that condition is made, over the same lock, only when code
    outside this class asks for ``_condition``: the stdlib's ``wait`` and ``as_completed``,
    or ``Future``'s own methods called on it.
    """

    _stopper: Any = None  # set by the pool: the dispatcher that can stop the task
    _task_id = 0
    _stop_requested = False
    # The pool's own hooks, for progress counting. They are called once, when the future
    # is done, on whichever thread resolved it, before the done-callbacks are handed on.
    # They only put a number on a queue, so they may run on the dispatcher thread. See
    # ``_when_done``.
    _done_hooks: list[Callable[[Future[Any]], None]] | None = None
    _made_condition: threading.Condition | None = None

    def __init__(self) -> None:  # not Future.__init__: see the class docstring
        self._lock = InterruptSafeLock()  # a C RLock: threading.RLock is a Python function
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[Future[T]], object]] = []
        # One latch per caller waiting in result() or exception(), released when the
        # future is done. The waiters never take the future's lock while it is not done,
        # so a Ctrl-C in a wait cannot leave it taken for the dispatcher to block on.
        self._wakers: list[Latch] = []

    @property
    def _condition(self) -> threading.Condition:
        made = self._made_condition
        if made is None:
            # No lock: two threads asking at once make one each, and setdefault keeps one.
            made = self.__dict__.setdefault("_made_condition", threading.Condition(self._lock))
        return made

    @_condition.setter
    def _condition(self, condition: threading.Condition) -> None:
        self._made_condition = condition  # tests put a spy here

    def _notify_locked(self) -> None:
        """Wakes threads in ``_condition.wait()``, where only ``Future``'s own methods
        wait. Called with ``_lock`` held."""
        if self._made_condition is not None:
            self._made_condition.notify_all()

    def __repr__(self) -> str:
        state, exception = self._state, self._exception
        description = _compat.future_state_description(state)
        if state == FINISHED:
            if _holds_exception(exception):
                return (f"<{type(self).__name__} at {id(self):#x} state={description} "
                        f"raised {type(exception).__name__}>")
            return (f"<{type(self).__name__} at {id(self):#x} state={description} "
                    f"returned {type(self._result).__name__}>")
        return f"<{type(self).__name__} at {id(self):#x} state={description}>"

    # -- what callers see --------------------------------------------------------------

    def cancelled(self) -> bool:
        return self._state in _CANCELLED_STATES  # one read: no lock needed

    def running(self) -> bool:
        return self._state == RUNNING

    def done(self) -> bool:
        return self._state in _DONE_STATES

    def _wait_done(self, timeout: float | None) -> bool:
        if self._state in _DONE_STATES:
            return True
        latch = Latch()
        self._wakers.append(latch)  # then look again: _wake sets the state, then reads this
        try:
            return self._state in _DONE_STATES or latch.wait(timeout)
        finally:
            if not latch.is_set:  # timed out or interrupted: a poller must not pile them up
                try:
                    self._wakers.remove(latch)
                except ValueError:
                    pass

    def _wake(self) -> None:
        """Release the waiters (after the state became a done one)."""
        if _shake.on:
            _shake.pause("future.before_wake")
        if not self._wakers:
            return  # the usual case: nobody waits on this one
        for latch in list(self._wakers):
            latch.set()

    def _wait_finished(self, timeout: float | None) -> None:
        """Wait until done; raise CancelledError or TimeoutError unless it finished."""
        self._wait_done(timeout)
        state = self._state
        if state in _CANCELLED_STATES:
            raise CancelledError()
        if state != FINISHED:
            raise TimeoutError()

    def result(self, timeout: float | None = None) -> T:
        try:
            self._wait_finished(timeout)
            if _holds_exception(self._exception):
                # No comment on the next line: a task's traceback shows it, as the stdlib's
                # shows its own ``raise self._exception``.
                raise self._exception
            return self._result  # type: ignore[no-any-return]
        finally:
            # The exception raised here keeps this frame in its traceback, and the future
            # keeps the exception. Drop the frame's reference, as the stdlib's result()
            # does, so the future, and the pool it names, is freed without the GC.
            del self

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_finished(timeout)
        return self._exception

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        with self._lock:
            if self._state not in _DONE_STATES:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            _compat.futures_logger().exception("exception calling callback for %r", self)

    def stop(self) -> bool:
        """Stop the task: cancel it if it has not started; if it is running, kill its
        worker (the pool starts a new one) and end this future cancelled.

        Returns False if the task had already finished, else True. The future then ends
        cancelled, even if the task happens to finish before its worker is killed:
        ``cancelled()`` is True and ``result()`` raises ``CancelledError``. It ends
        cancelled at once if the task is still in the pool's queue. A task already sent to
        a worker, running or waiting in its pipe behind another, ends cancelled as soon as
        the pool has taken it back or killed that worker.
        """
        while True:
            with self._lock:
                state = self._state
                if state == FINISHED:
                    return False
                if state in _CANCELLED_STATES:
                    return True
                if state == RUNNING:
                    self._stop_requested = True
                    break
            if self.cancel():  # PENDING: an ordinary cancel, unless it just started
                return True
        if self._stopper is not None:
            self._stopper.stop_task(self._task_id)
        return True

    def cancel(self) -> bool:
        """As ``Future.cancel``. A cancelled task also leaves the pool's queue, and the
        counts of ``stats()``, at once, not when it reaches the front. Takes no lock but the
        future's own, so it is safe where the stdlib's is: in a done-callback, a signal
        handler, a forked child. Runs the done-callbacks after releasing it."""
        with self._lock:
            state = self._state
            if state == RUNNING or state == FINISHED:
                return False
            if state in _CANCELLED_STATES:
                return True
            self._state = CANCELLED
            self._notify_locked()
        if self._stopper is not None:
            self._stopper.cancelled(self._task_id)
        self._wake()
        self._invoke_callbacks()
        return True

    # -- what the pool does ------------------------------------------------------------

    def set_running_or_notify_cancel(self) -> bool:
        with self._lock:
            state = self._state
            if state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if state == PENDING:
                self._state = RUNNING
                return True
        _compat.futures_logger().critical("Future %s in unexpected state: %s", id(self), state)
        raise RuntimeError("Future in unexpected state")

    def set_result(self, result: T) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception, failed=True)

    def _finish(self, result: Any, exception: BaseException | None, failed: bool = False
                ) -> None:
        with self._lock:
            state = self._state
            if self._stop_requested:  # stop() was promised: it ends cancelled
                ended = self._end_cancelled_locked()
            elif state in _DONE_STATES:
                ended = None
            else:
                self._result, self._exception = result, exception
                self._state = FINISHED
                for waiter in self._waiters:
                    if failed:
                        waiter.add_exception(self)
                    else:
                        waiter.add_result(self)
                self._notify_locked()
                ended = FINISHED
        if ended is None and not self._stop_requested:
            raise InvalidStateError(f"{state}: {self!r}")
        self._after_end(ended)

    def _end_cancelled(self) -> None:
        """End cancelled whatever the state (running included), waking every waiter."""
        with self._lock:
            ended = self._end_cancelled_locked()
        self._after_end(ended)

    def _end_cancelled_locked(self) -> str | None:
        """The state it ended cancelled from, or None if it had already ended. Called
        with ``_lock`` held."""
        state = self._state
        if state in (FINISHED, CANCELLED_AND_NOTIFIED):
            return None
        self._state = CANCELLED_AND_NOTIFIED
        for waiter in self._waiters:
            waiter.add_cancelled(self)
        self._notify_locked()
        return state

    def _after_end(self, ended_from: str | None) -> None:
        """Wakes the waiters and runs the callbacks of a future that has just ended, unless
        ``cancel()`` already ran them."""
        if ended_from is None:
            return
        self._wake()
        if ended_from != CANCELLED:
            self._invoke_callbacks()

    def _when_done(self, hook: Callable[[Future[Any]], None]) -> None:
        """Calls the pool's ``hook(future)`` once this future is done, or at once if it
        is. Unlike a done-callback it runs on the resolving thread, the dispatcher's
        included, so it must never block or raise. For the pool's own progress counting."""
        with self._lock:
            if self._state not in _DONE_STATES:
                if self._done_hooks is None:
                    self._done_hooks = []
                self._done_hooks.append(hook)
                return
        hook(self)

    def _invoke_callbacks(self) -> None:
        hooks = self._done_hooks
        if hooks is not None:
            self._done_hooks = None
            for hook in hooks:
                hook(self)
        runner = runner_of_this_thread()
        if runner is None:
            run_callbacks(self)  # a caller's thread (cancel()): run them here, as stdlib
        elif self._done_callbacks:
            runner.put(self)

    def __await__(self) -> Generator[Any, None, T]:
        import asyncio  # only coroutines pay for it
        try:
            return (yield from asyncio.wrap_future(self).__await__())
        except asyncio.CancelledError:
            self.stop()  # a queued task was cancelled by wrap_future; a running one stops
            raise


def _holds_exception(exception: BaseException | None) -> TypeGuard[BaseException]:
    """Whether a finished future holds an exception: ``is not None``, as 3.14's ``Future``
    asks. Earlier versions asked its truth, and swallowed an exception that is false
    (gh-132063)."""
    return exception is not None


def failed_future(error: BaseException) -> PoolFuture[Any]:
    """A future that has already failed: a call that could not be sent."""
    future: PoolFuture[Any] = PoolFuture()
    future.set_exception(error)
    return future


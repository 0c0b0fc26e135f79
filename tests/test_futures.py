"""PoolFuture on its own: the unit-level spec of the futures the pool returns.

No pool and no processes: each test makes a ``PoolFuture()``, resolves it itself (as the
dispatcher would, through the calls an executor makes) and looks at it through its public
methods. Where pool promises the stdlib's behaviour, the test runs over
``concurrent.futures.Future`` too (the ``future_class`` fixture), so the drop-in promise
is pinned by the stdlib itself. Threads that must be blocked before the test acts are
seen blocked through their stacks (``waiting_in``), not given time to get there.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures as cf
import contextlib
import gc
import re
import signal
import sys
import threading
import time
import traceback
import typing
import weakref
from functools import partial
from typing import Any, Callable, Iterator

import pytest

import pool
from pool._callbacks import CallbackRunner, install_on_dispatcher_thread
from pool._futures import PoolFuture
from helpers import wait_until

Future = cf.Future
FutureClass = type[Future[Any]]  # cf.Future, or PoolFuture


@pytest.fixture(params=[cf.Future, PoolFuture], ids=["stdlib", "pool"])
def future_class(request: pytest.FixtureRequest) -> FutureClass:
    return request.param  # type: ignore[no-any-return]


def in_state(future_class: FutureClass, state: str) -> Future[Any]:
    """A future brought to ``state`` by the calls an executor makes."""
    future = future_class()
    if state == "running":
        assert future.set_running_or_notify_cancel() is True
    elif state in ("cancelled", "cancelled and notified"):
        assert future.cancel() is True
        if state == "cancelled and notified":  # what an executor does before running it
            assert future.set_running_or_notify_cancel() is False
    elif state == "returned":
        assert future.set_running_or_notify_cancel() is True
        future.set_result(42)
    elif state == "raised":
        assert future.set_running_or_notify_cancel() is True
        future.set_exception(ValueError("boom"))
    else:
        assert state == "pending"
    return future


def end(future: Future[Any], ending: str) -> None:
    """End ``future`` as the pool would: with a result, an exception, or cancelled (and
    notified, as an executor does when it reaches a cancelled future)."""
    if ending == "result":
        future.set_result(7)
    elif ending == "exception":
        future.set_exception(ValueError("boom"))
    else:
        assert ending == "cancel" and future.cancel()
        assert future.set_running_or_notify_cancel() is False


def pool_future_in(state: str) -> PoolFuture[Any]:
    future = in_state(PoolFuture, state)
    assert isinstance(future, PoolFuture)
    return future


def outcome(call: Callable[[], object]) -> str:
    """What ``call()`` did, in words: what it returned, or the type it raised."""
    try:
        value = call()
    except Exception as exc:
        return f"raises {type(exc).__name__}"
    return f"returns {value!r}"


def waiting_in(thread: threading.Thread, function: Callable[..., object]) -> bool:
    """Whether ``thread`` is blocked in a ``wait`` (a ``Condition``'s, an ``Event``'s or a
    ``Latch``'s) that ``function`` called, however deeply."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_name != "wait":
        return False
    target = function.__code__
    while frame is not None:
        if frame.f_code is target:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def when_waiting(waiter: threading.Thread, function: Callable[..., object],
                 action: Callable[[], object]) -> Iterator[None]:
    """Around a block in which ``waiter`` comes to wait in ``function``: a thread calls
    ``action()`` once it does. If it is never seen waiting, the action still runs (after
    20 s, so that the block ends) and the test fails."""
    seen: list[bool] = []

    def act() -> None:
        seen.append(wait_until(lambda: waiting_in(waiter, function), 20))
        action()

    helper = threading.Thread(target=act, name="when-waiting")
    helper.start()
    try:
        yield
    finally:
        helper.join(30)
    assert seen == [True], f"{waiter.name} was not seen waiting in {function.__qualname__}"


# -- what each state answers -------------------------------------------------------------------

# state: done(), running(), cancelled(), result(0), exception(0), cancel(), repr's word.
STATES = {
    "pending": (False, False, False, "raises TimeoutError", "raises TimeoutError",
                True, "pending"),
    "running": (False, True, False, "raises TimeoutError", "raises TimeoutError",
                False, "running"),
    "cancelled": (True, False, True, "raises CancelledError", "raises CancelledError",
                  True, "cancelled"),
    "cancelled and notified": (True, False, True, "raises CancelledError",
                               "raises CancelledError", True, "cancelled"),
    "returned": (True, False, False, "returns 42", "returns None", False,
                 "finished returned int"),
    "raised": (True, False, False, "raises ValueError", "returns ValueError('boom')", False,
               "finished raised ValueError"),
}


@pytest.mark.parametrize("state", STATES)
def test_what_each_state_answers(future_class: FutureClass, state: str) -> None:
    done, running, cancelled, result, exception, cancels, described = STATES[state]
    future = in_state(future_class, state)
    assert (future.done(), future.running(), future.cancelled()) == (done, running, cancelled)
    assert outcome(lambda: future.result(0)) == result
    assert outcome(lambda: future.exception(0)) == exception
    assert re.fullmatch(rf"<{future_class.__name__} at 0x[0-9a-f]+ state={described}>",
                        repr(future)), repr(future)
    assert future.cancel() is cancels
    # cancel() only ever moves a pending future, to cancelled; a second one changes nothing.
    assert future.cancelled() is (cancelled or cancels)
    assert future.done() is (done or cancels)
    assert future.cancel() is cancels


def test_a_pool_future_is_a_generic_stdlib_future() -> None:
    assert issubclass(PoolFuture, cf.Future) and pool.PoolFuture is PoolFuture
    alias = PoolFuture[int]
    assert typing.get_origin(alias) is PoolFuture and typing.get_args(alias) == (int,)


@pytest.mark.parametrize("state", STATES)
def test_what_an_executor_may_do_in_each_state(future_class: FutureClass, state: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    # set_running_or_notify_cancel(): True once from pending, False once from cancelled,
    # else RuntimeError (logged as critical, as the stdlib does).
    answers = {"pending": "returns True", "cancelled": "returns False"}
    expected = answers.get(state, "raises RuntimeError")
    future = in_state(future_class, state)
    assert outcome(future.set_running_or_notify_cancel) == expected
    if state == "pending":
        assert future.running()
    if state == "cancelled":
        assert future.cancelled()
    assert any(r.levelname == "CRITICAL" for r in caplog.records) is expected.startswith("raises")
    # set_result() / set_exception(): from pending or running; InvalidStateError once done,
    # and the outcome stays the first one.
    for ending, result in (("result", "returns 7"), ("exception", "raises ValueError")):
        future = in_state(future_class, state)
        before = outcome(lambda: future.result(0))
        if STATES[state][0]:
            with pytest.raises(cf.InvalidStateError):
                end(future, ending)
            assert outcome(lambda: future.result(0)) == before
        else:
            end(future, ending)
            assert future.done() and outcome(lambda: future.result(0)) == result


@pytest.mark.parametrize("state", ["pending", "running"])
@pytest.mark.parametrize("timeout", [0, -1, 0.05])
@pytest.mark.timeout(30)
def test_result_and_exception_time_out_with_timeout_error(future_class: FutureClass, state: str,
                                                          timeout: float) -> None:
    assert cf.TimeoutError is TimeoutError  # the builtin, from 3.11 on
    future = in_state(future_class, state)
    for method in (future.result, future.exception):
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            method(timeout)
        assert time.monotonic() - started >= timeout - 0.01
    assert not future.done() and future.running() is (state == "running")
    future.set_result(1)  # a wait that timed out leaves the future as it was
    assert future.result(timeout) == 1 and future.exception(timeout) is None


def fail_with_a_cause() -> None:
    missing: dict[str, int] = {}
    try:
        missing["key"]
    except KeyError as error:
        raise ValueError("from the task") from error


def test_exception_returns_the_exception_with_its_traceback_and_result_raises_it(
        future_class: FutureClass) -> None:
    future = future_class()
    try:
        fail_with_a_cause()
    except ValueError as error:
        future.set_exception(error)
        raised = error
    assert future.exception() is raised and isinstance(raised.__cause__, KeyError)
    names = [frame.name for frame in traceback.extract_tb(raised.__traceback__)]
    assert names[-1] == "fail_with_a_cause"
    with pytest.raises(ValueError) as caught:
        future.result()
    assert caught.value is raised  # the very object: its frames and chain come with it
    assert "fail_with_a_cause" in [f.name for f in traceback.extract_tb(caught.value.__traceback__)]


def test_a_failed_result_leaves_no_cycle_that_keeps_the_future(future_class: FutureClass) -> None:
    # The raised exception's traceback holds result()'s frame, and the future holds the
    # exception: result() lets go of the future so that it is freed without the GC.
    gc.disable()
    try:
        future = future_class()
        future.set_exception(ValueError("boom"))
        with pytest.raises(ValueError):
            future.result()
        gone = weakref.ref(future)
        del future
        assert gone() is None
    finally:
        gc.enable()


def test_an_exception_that_is_false_is_still_raised() -> None:
    # gh-132063: before 3.14 the stdlib's Future asked an exception's truth, and returned
    # None for one that is false; a pool future asks ``is not None``.
    class FalseError(Exception):
        def __bool__(self) -> bool:
            return False

    future: PoolFuture[None] = PoolFuture()
    future.set_exception(FalseError())
    with pytest.raises(FalseError):
        future.result()
    assert isinstance(future.exception(), FalseError) and "raised FalseError" in repr(future)


# -- done-callbacks ----------------------------------------------------------------------------

@pytest.mark.parametrize("ending", ["result", "exception", "cancel"])
@pytest.mark.timeout(30)
def test_callbacks_run_once_in_order_on_the_thread_that_ends_the_future(
        future_class: FutureClass, ending: str) -> None:
    future = future_class()
    calls: list[tuple[str, Future[Any], threading.Thread]] = []

    def note(name: str, f: Future[Any]) -> None:
        calls.append((name, f, threading.current_thread()))

    for name in ("first", "second", "third"):
        future.add_done_callback(partial(note, name))
    resolver = threading.Thread(target=end, args=(future, ending), name="resolver")
    resolver.start()
    resolver.join(30)
    assert [(name, f) for name, f, _ in calls] == [
        ("first", future), ("second", future), ("third", future)]
    assert {thread for _, _, thread in calls} == {resolver}
    # Added once it is done: runs at once, on the adding thread.
    future.add_done_callback(partial(note, "late"))
    assert calls[-1] == ("late", future, threading.current_thread())
    # Nothing that can still be called on a done future runs them again.
    future.cancel()
    with pytest.raises(cf.InvalidStateError):
        future.set_result(1)
    with pytest.raises(RuntimeError):
        future.set_running_or_notify_cancel()
    assert len(calls) == 4


@pytest.mark.parametrize("added", ["before it ends", "after it ended"])
def test_a_callback_that_raises_is_logged_and_the_next_one_runs(
        future_class: FutureClass, added: str, caplog: pytest.LogCaptureFixture) -> None:
    future = future_class()
    error = RuntimeError("from a callback")
    ran: list[Future[Any]] = []

    def raising(f: Future[Any]) -> None:
        raise error

    if added == "after it ended":
        future.set_result(1)
    future.add_done_callback(raising)
    future.add_done_callback(ran.append)
    if added == "before it ends":
        future.set_result(1)
    assert ran == [future]
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [error]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_callback_that_raises_anything_is_logged_and_the_future_still_ends(
        raised: type[BaseException], caplog: pytest.LogCaptureFixture) -> None:
    # The stdlib's Future catches Exception only: there, this would escape set_result().
    # The pool's promise is that nothing a callback raises reaches whoever ended the future.
    future: PoolFuture[int] = PoolFuture()
    ran: list[Future[Any]] = []

    def raising(f: Future[Any]) -> None:
        raise raised()

    future.add_done_callback(raising)
    future.add_done_callback(ran.append)
    future.set_result(1)
    assert ran == [future] and future.result() == 1
    assert [type(r.exc_info[1]) for r in caplog.records if r.exc_info] == [raised]


def test_a_callback_added_to_a_done_future_runs_as_a_plain_call(future_class: FutureClass) -> None:
    # As the stdlib's: on the adding thread, at once, so what is not an Exception reaches
    # the caller of add_done_callback, who is the one the callback runs for.
    future = in_state(future_class, "returned")

    def interrupted(f: Future[Any]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        future.add_done_callback(interrupted)


@pytest.mark.timeout(30)
def test_callbacks_added_while_another_thread_ends_the_futures_run_exactly_once(
        future_class: FutureClass) -> None:
    futures = [future_class() for _ in range(300)]
    runs = [[0, 0, 0] for _ in futures]
    start = threading.Barrier(2, timeout=20)

    def count(i: int, k: int, f: Future[Any]) -> None:
        runs[i][k] += 1

    def add_callbacks() -> None:
        start.wait()
        for i, future in enumerate(futures):
            for k in range(3):
                future.add_done_callback(partial(count, i, k))

    adder = threading.Thread(target=add_callbacks, name="adder")
    adder.start()
    start.wait()
    for i, future in enumerate(futures):
        future.set_result(i)
    adder.join(30)
    assert runs == [[1, 1, 1]] * len(futures)


@pytest.mark.timeout(30)
def test_callbacks_of_futures_ended_on_the_dispatcher_thread_run_on_the_runners_threads(
        caplog: pytest.LogCaptureFixture) -> None:
    # The dispatcher installs its runner on its own thread; any thread that does so stands
    # in for it here. What it ends, it ends at once: the callbacks run elsewhere, and one
    # that blocks holds up neither the dispatcher nor the callbacks of other futures.
    runner = CallbackRunner("test-callbacks")
    blocking, raising, other, cancelled = (PoolFuture[int]() for _ in range(4))
    release, blocked, other_ran = threading.Event(), threading.Event(), threading.Event()
    calls: list[tuple[str, threading.Thread]] = []

    def note(name: str, f: Future[Any]) -> None:
        calls.append((name, threading.current_thread()))

    def block(f: Future[Any]) -> None:
        note("blocking", f)
        blocked.set()
        release.wait(30)

    def raise_(error: BaseException, f: Future[Any]) -> None:
        raise error

    def other_done(f: Future[Any]) -> None:
        note("other", f)
        other_ran.set()

    blocking.add_done_callback(block)
    for error in (ValueError("v"), KeyboardInterrupt(), SystemExit(3)):
        raising.add_done_callback(partial(raise_, error))
    raising.add_done_callback(partial(note, "after the raising ones"))
    other.add_done_callback(other_done)
    cancelled.add_done_callback(partial(note, "cancelled"))

    def dispatch() -> None:
        install_on_dispatcher_thread(runner)
        blocking.set_result(1)
        assert blocked.wait(30)  # its callback has a thread, and blocks it
        raising.set_exception(ValueError("the task's"))
        other.set_result(3)
        assert cancelled.cancel()

    dispatcher = threading.Thread(target=dispatch, name="fake-dispatcher")
    dispatcher.start()
    dispatcher.join(30)
    try:
        assert not dispatcher.is_alive()
        assert other_ran.wait(30)  # while the blocking callback still blocks its thread
        assert all(f.done() for f in (blocking, raising, other, cancelled))
    finally:
        release.set()
        runner.close()
        assert runner.join(30) == []
    assert sorted(name for name, _ in calls) == [
        "after the raising ones", "blocking", "cancelled", "other"]
    assert all(t.name.startswith("test-callbacks-") for _, t in calls)
    assert len({t for name, t in calls if name in ("blocking", "other")}) == 2
    raised = [type(r.exc_info[1]) for r in caplog.records if r.exc_info]
    assert raised == [ValueError, KeyboardInterrupt, SystemExit]


# -- waiting -----------------------------------------------------------------------------------

# A waiter: what it calls, and (given the future's class) the function it waits in.
Waiter = tuple[Callable[[Future[Any]], object],
               Callable[[FutureClass], Callable[..., object]]]
WAITERS: dict[str, Waiter] = {
    "result()": (lambda f: f.result(), lambda cls: cls.result),
    "result(30)": (lambda f: f.result(30), lambda cls: cls.result),
    "exception()": (lambda f: f.exception(), lambda cls: cls.exception),
    "exception(30)": (lambda f: f.exception(30), lambda cls: cls.exception),
    "wait": (lambda f: cf.wait([f], 30).done == {f}, lambda cls: cf.wait),
    "as_completed": (lambda f: list(cf.as_completed([f], 30)) == [f],
                     lambda cls: cf.as_completed),
}
ENDED_CANCELLED = {"result()": "raises CancelledError", "result(30)": "raises CancelledError",
                   "exception()": "raises CancelledError",
                   "exception(30)": "raises CancelledError",
                   "wait": "returns True", "as_completed": "returns True"}
SEEN_BY_WAITERS = {
    "result": {"result()": "returns 7", "result(30)": "returns 7",
               "exception()": "returns None", "exception(30)": "returns None",
               "wait": "returns True", "as_completed": "returns True"},
    "exception": {"result()": "raises ValueError", "result(30)": "raises ValueError",
                  "exception()": "returns ValueError('boom')",
                  "exception(30)": "returns ValueError('boom')",
                  "wait": "returns True", "as_completed": "returns True"},
    "cancel": ENDED_CANCELLED,
    "stop": ENDED_CANCELLED,
}


def stop_then_finish(future: Future[Any]) -> None:
    """What the pool does to a running task that stop() was called on: the task's own
    result may still arrive before its worker is killed; the future ends cancelled."""
    assert isinstance(future, PoolFuture)
    assert future.stop() is True and future.running()
    future.set_result(7)


@pytest.mark.parametrize("future_class, ending", [
    (cf.Future, "result"), (cf.Future, "exception"), (cf.Future, "cancel"),
    (PoolFuture, "result"), (PoolFuture, "exception"), (PoolFuture, "cancel"),
    (PoolFuture, "stop")], ids=lambda p: p if isinstance(p, str) else p.__name__)
@pytest.mark.timeout(30)
def test_every_kind_of_waiter_is_woken_however_the_future_ends(future_class: FutureClass,
                                                               ending: str) -> None:
    future = in_state(future_class, "running" if ending == "stop" else "pending")
    seen: dict[str, str] = {}

    def wait_and_note(name: str, call: Callable[[Future[Any]], object]) -> None:
        seen[name] = outcome(lambda: call(future))

    waiters = [threading.Thread(target=wait_and_note, args=(name, call), name=name)
               for name, (call, _) in WAITERS.items()]
    for waiter in waiters:
        waiter.start()
    try:
        assert wait_until(lambda: all(waiting_in(w, WAITERS[w.name][1](future_class))
                                      for w in waiters), 20)
    finally:
        if ending == "stop":
            stop_then_finish(future)
        else:
            end(future, ending)
        for waiter in waiters:
            waiter.join(30)
    assert seen == SEEN_BY_WAITERS[ending]


@pytest.mark.timeout(30)
def test_wait_takes_pool_and_stdlib_futures_together() -> None:
    returned, raised = in_state(PoolFuture, "returned"), in_state(cf.Future, "raised")
    cancelled = in_state(PoolFuture, "cancelled and notified")
    pending_pool, pending_stdlib = PoolFuture[int](), Future[int]()
    everything = {returned, raised, cancelled, pending_pool, pending_stdlib}
    assert cf.wait(everything, timeout=0) == ({returned, raised, cancelled},
                                              {pending_pool, pending_stdlib})
    assert cf.wait(everything, 30, cf.FIRST_EXCEPTION).done == {returned, raised, cancelled}
    main = threading.current_thread()
    with when_waiting(main, cf.wait, lambda: pending_pool.set_result(1)):
        first = cf.wait({pending_pool, pending_stdlib}, 30, cf.FIRST_COMPLETED)
    assert first == ({pending_pool}, {pending_stdlib})
    with when_waiting(main, cf.wait, lambda: pending_stdlib.set_result(2)):
        assert cf.wait(everything, 30) == (everything, set())
    # A future that was cancelled but never notified is not done for wait(), in both.
    unnotified = [in_state(PoolFuture, "cancelled"), in_state(cf.Future, "cancelled")]
    assert cf.wait(unnotified, timeout=0).not_done == set(unnotified)


@pytest.mark.parametrize("variant", ["concurrent.futures", "pool", "pool with progress"])
@pytest.mark.timeout(30)
def test_as_completed_yields_each_future_once_cancelled_ones_included(variant: str) -> None:
    counts: list[int] = []
    variants: dict[str, Callable[..., Iterator[Future[Any]]]] = {
        "concurrent.futures": cf.as_completed, "pool": pool.as_completed,
        "pool with progress": partial(pool.as_completed, progress=counts.append)}
    as_completed = variants[variant]
    ended = [in_state(PoolFuture, "returned"), in_state(cf.Future, "raised"),
             in_state(PoolFuture, "cancelled and notified")]
    pending: list[Future[Any]] = [PoolFuture(), cf.Future(), PoolFuture()]

    def end_the_rest() -> None:
        end(pending[2], "cancel")
        end(pending[1], "exception")
        end(pending[0], "result")

    with when_waiting(threading.current_thread(), cf.as_completed, end_the_rest):
        seen = list(as_completed(ended + pending, timeout=30))
    assert len(seen) == 6 and set(seen) == set(ended + pending)
    assert set(seen[:3]) == set(ended)  # those done already come first
    if variant == "pool with progress":
        assert sum(counts) == 4  # cancelled futures are not counted


# -- Ctrl-C while waiting ----------------------------------------------------------------------

def interrupt_main(how: str) -> None:
    """Ctrl-C for the main thread: a real SIGINT, or only its effect. The effect alone
    wakes no sleeping thread: a wait that never wakes up by itself would never see it."""
    if how == "SIGINT":
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    else:
        _thread.interrupt_main()


WAITS: dict[str, tuple[Callable[[PoolFuture[Any]], object], Callable[..., object]]] = {
    "result()": (lambda f: f.result(), PoolFuture.result),
    "result(60)": (lambda f: f.result(60), PoolFuture.result),
    "exception()": (lambda f: f.exception(), PoolFuture.exception),
}


@pytest.mark.parametrize("how", ["SIGINT", "interrupt_main"])
@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.timeout(30)
def test_ctrl_c_in_a_wait_propagates_and_leaves_the_future_usable(how: str, wait: str) -> None:
    main = threading.current_thread()
    assert main is threading.main_thread()
    future: PoolFuture[int] = PoolFuture()
    call, waits_in = WAITS[wait]
    sent: list[float] = []

    def press_ctrl_c() -> None:
        sent.append(time.monotonic())
        interrupt_main(how)

    with when_waiting(main, waits_in, press_ctrl_c):
        with pytest.raises(KeyboardInterrupt):
            call(future)
    # Waits wake up at least every 0.25 s to see it; this bound only names the failure.
    assert time.monotonic() - sent[0] < 10
    assert not future.done() and not future.cancelled()
    ran: list[Future[Any]] = []
    future.add_done_callback(ran.append)
    with when_waiting(main, PoolFuture.result, lambda: future.set_result(5)):
        assert future.result(30) == 5
    assert future.exception() is None and ran == [future]


@pytest.mark.parametrize("how", ["SIGINT", "interrupt_main"])
@pytest.mark.timeout(60)
def test_a_ctrl_c_that_closely_follows_the_call_is_not_lost(how: str) -> None:
    # Sent just as result() starts, the signal can come after the interpreter's last look
    # for one and before the thread sleeps on a lock; a wait without a timeout would then
    # sleep for good. Many tries, so that some land in that window.
    assert threading.current_thread() is threading.main_thread()
    future: PoolFuture[int] = PoolFuture()

    def press_ctrl_c_once(calling: threading.Event) -> None:
        calling.wait(30)
        interrupt_main(how)

    for _ in range(20):
        calling = threading.Event()
        helper = threading.Thread(target=press_ctrl_c_once, args=(calling,), name="ctrl-c")
        helper.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                calling.set()
                future.result()
        finally:
            helper.join(30)
    future.set_result(1)
    assert future.result() == 1


# -- stop() and await: the pool's own ----------------------------------------------------------

# state: what stop() returns, and whether the future is cancelled right after.
STOPS = {"pending": (True, True), "running": (True, False), "cancelled": (True, True),
         "cancelled and notified": (True, True), "returned": (False, False),
         "raised": (False, False)}


@pytest.mark.parametrize("state", STOPS)
def test_stop_returns_whether_the_future_ends_cancelled(state: str) -> None:
    future = pool_future_in(state)
    before = outcome(lambda: future.result(0))
    returned, cancelled_now = STOPS[state]
    assert future.stop() is returned and future.cancelled() is cancelled_now
    if not returned:  # a finished future keeps its outcome
        assert outcome(lambda: future.result(0)) == before
    if state == "running":  # without a pool nothing kills it: it ends when the task does
        assert future.running() and future.cancel() is False
        future.set_result(1)
        assert future.cancelled()
    assert future.stop() is returned  # asking again gives the same answer


@pytest.mark.parametrize("finish", ["set_result", "set_exception"])
def test_a_running_future_asked_to_stop_ends_cancelled_whatever_the_task_gives(
        finish: str) -> None:
    future = pool_future_in("running")
    ran: list[Future[Any]] = []
    future.add_done_callback(ran.append)
    assert future.stop() is True and ran == []
    # The task's own outcome arrives before the worker is killed: not an error.
    getattr(future, finish)(ValueError("late") if finish == "set_exception" else 1)
    assert future.cancelled() and future.done() and ran == [future]
    with pytest.raises(cf.CancelledError):
        future.result(0)
    with pytest.raises(cf.CancelledError):
        future.exception(0)
    assert cf.wait([future], timeout=0).done == {future}  # notified, as a cancel is
    assert "state=cancelled" in repr(future)


def test_awaiting_a_future_gives_its_result_or_raises_its_exception() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        returned: PoolFuture[int] = PoolFuture()
        loop.call_soon(returned.set_result, 5)
        assert await returned == 5
        raised: PoolFuture[int] = PoolFuture()
        loop.call_soon(raised.set_exception, KeyError("k"))
        with pytest.raises(KeyError):
            await raised
        assert await pool_future_in("returned") == 42

    asyncio.run(main())


@pytest.mark.parametrize("state", ["pending", "running"])
def test_cancelling_a_coroutine_that_awaits_a_future_stops_it(state: str) -> None:
    future = pool_future_in(state)

    async def main() -> None:
        awaiting = asyncio.Event()

        async def waiter() -> object:
            awaiting.set()
            return await future

        task = asyncio.create_task(waiter())
        await awaiting.wait()  # the waiter is now suspended in its await
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    if state == "pending":  # cancelled at once
        assert future.cancelled()
    else:  # stopped: it ends cancelled when the pool has taken it back
        assert future.running()
        future.set_result(1)
        assert future.cancelled()

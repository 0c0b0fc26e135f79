"""``InterruptSafeLock`` (``pool._locks``): a Ctrl-C never leaves it taken, and the locks
that callers' threads take are all of that kind; a Ctrl-C inside the first submit's
``Thread.start()`` leaves exactly one thread on the loop.

Each scenario runs in a child interpreter, since it raises KeyboardInterrupt on purpose.
The interrupt is made to land at the exact moment that matters: the signal is tripped by
another thread after the main thread has passed its last signal check before taking the
lock, so the handler runs just after the lock is taken (or while it waits for it).
"""

from __future__ import annotations

import multiprocessing
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import pool
from helpers import START_METHODS, run_script
from pool._dispatcher.front import Dispatcher, EndedFuture
from pool._futures import PoolFuture
from pool._locks import InterruptSafeLock

INTERRUPT_AS_THE_LOCK_IS_TAKEN = '''
import signal, sys, threading
from pool._locks import InterruptSafeLock
lock = {factory}()
holding, entering = threading.Event(), False

def hold_then_interrupt():
    with lock:
        holding.set()
        while not entering:  # the main thread is past its last signal check
            pass
        {interrupt}
    # released: the main thread takes the lock now, with the interrupt pending

holder = threading.Thread(target=hold_then_interrupt)
holder.start()
holding.wait()
try:
    entering = True
    with lock:
        print("ENTERED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
holder.join()
taken = []
taker = threading.Thread(target=lambda: taken.append(lock.acquire(timeout=2)))
taker.start()
taker.join()
print("FREE" if taken == [True] else "LEFT_TAKEN", flush=True)
'''

# Tripped in the holder's thread: the main thread learns of it only at its next check.
TRIP_FROM_ANOTHER_THREAD = "signal.raise_signal(signal.SIGINT)"
# Sent to the main thread while it waits for the lock (or is about to).
SEND_TO_THE_WAITER = "signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)"


def run_scenario(factory: str, interrupt: str) -> list[str]:
    script = INTERRUPT_AS_THE_LOCK_IS_TAKEN.format(factory=factory, interrupt=interrupt)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


# The condition of the future that ``async with`` awaits for the pool's end: ``with`` enters
# it through threading.Condition.__enter__, a Python function around the lock's.
ENDED_FUTURES_CONDITION = ("(lambda: __import__('pool._dispatcher.front', fromlist=['_'])"
                           ".EndedFuture()._condition)")
PLAIN_FUTURES_CONDITION = "(lambda: __import__('concurrent.futures').futures.Future()._condition)"


@pytest.mark.parametrize("factory", ["InterruptSafeLock", ENDED_FUTURES_CONDITION],
                         ids=["InterruptSafeLock", "the pool's ended future"])
@pytest.mark.parametrize("interrupt", [TRIP_FROM_ANOTHER_THREAD, SEND_TO_THE_WAITER],
                         ids=["as it is taken", "while it waits"])
def test_a_ctrl_c_never_leaves_the_lock_taken(interrupt, factory):
    assert run_scenario(factory, interrupt) == ["INTERRUPTED", "FREE"]


def test_the_premise_a_plain_futures_condition_is_left_taken():
    # Why the pool's ended future has its own lock: Condition.__enter__ is a Python
    # function that calls the C lock's, and the check for signals after that call raises
    # the interrupt with the lock held, on every version.
    outcome = run_scenario(PLAIN_FUTURES_CONDITION, TRIP_FROM_ANOTHER_THREAD)
    assert outcome == ["INTERRUPTED", "LEFT_TAKEN"]


def test_the_ended_future_cannot_be_cancelled():
    # asyncio.wrap_future cancels the future it wraps when the awaiting task is cancelled.
    ended = EndedFuture()
    assert not ended.cancel() and not ended.done()
    ended.set_result(None)
    assert ended.done() and not ended.cancelled()


@pytest.mark.skipif(sys.version_info[:2] != (3, 14), reason="only 3.14's with statement "
                    "checks for signals between a C __enter__ and its block")
@pytest.mark.parametrize("factory", ["threading.Lock", "threading.RLock"])
def test_the_premise_a_plain_lock_is_left_taken_on_3_14(factory):
    # Why InterruptSafeLock exists: with a C lock, the interrupt lands after the lock is
    # taken and before the block that would give it back. (3.15 no longer does this; on
    # every version, code that calls acquire() before its try does.)
    outcome = run_scenario(factory, TRIP_FROM_ANOTHER_THREAD)
    if outcome == ["INTERRUPTED", "FREE"]:
        pytest.skip(f"this 3.14 ({sys.version.split()[0]}) no longer leaks the lock")
    assert outcome == ["INTERRUPTED", "LEFT_TAKEN"]


def test_it_is_a_lock_as_the_stdlib_uses_one():
    lock = InterruptSafeLock()
    with lock:
        assert lock._is_owned()
        with lock:  # re-entrant, as PoolFuture's lock must be
            pass
        assert lock._is_owned()
    assert not lock._is_owned()
    assert lock.acquire(timeout=0)
    lock.release()


def test_the_locks_a_caller_takes_are_interrupt_safe():
    # Every lock that both a caller's thread and the dispatcher (or an exit hook) take.
    dispatcher = Dispatcher(max_workers=1, mp_context=multiprocessing.get_context(),
                            initializer=None, max_tasks_per_child=None)
    assert isinstance(dispatcher._lock, InterruptSafeLock)
    assert isinstance(dispatcher._callbacks._lock, InterruptSafeLock)
    assert isinstance(dispatcher.finished._condition._lock, InterruptSafeLock)
    assert isinstance(PoolFuture()._lock, InterruptSafeLock)
    assert isinstance(PoolFuture()._condition._lock, InterruptSafeLock)
    with pool.ProcessPool(1) as executor:
        assert isinstance(executor._dispatcher._lock, InterruptSafeLock)


# The only plain locks, events, conditions and futures pool makes, and why a Ctrl-C in a
# caller's thread cannot leave them taken for the dispatcher.
PLAIN_SYNC_ALLOWED = {
    # Released by the setter, never taken by it: waiters only poll it (see _latch).
    ("_latch.py", "self._lock = threading.Lock()"),
    # Taken with a timeout; a stuck one is expected and outwaited (see wakeup).
    ("_dispatcher/wakeup.py", "self._lock = threading.Lock()"),
    # Conditions over an InterruptSafeLock.
    ("_dispatcher/front.py", "self._condition = threading.Condition(InterruptSafeLock())"),
    ("_futures.py", '"_made_condition", threading.Condition(self._lock))'),
}
PLAIN_SYNC = re.compile(r"threading\.(Lock|RLock|Event|Condition|Semaphore|BoundedSemaphore|"
                        r"Barrier)\(|(?<![\w.])Future\(\)|queue\.Queue\(")


def test_pool_makes_no_other_plain_lock_event_or_future():
    package = pathlib.Path(pool.__file__).parent
    found = set()
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        for line in path.read_text().splitlines():
            code = line.split("#")[0]
            if PLAIN_SYNC.search(code):
                allowed = any(where == place and snippet in code
                              for place, snippet in PLAIN_SYNC_ALLOWED)
                found.add((where, code.strip(), allowed))
    assert [(where, code) for where, code, allowed in found if not allowed] == []
    assert len(found) == len(PLAIN_SYNC_ALLOWED)  # the allowlist names what is there


# The hang this was seen as: a Ctrl-C while shutdown(wait=True) took the dispatcher's lock
# (made to land just after it is taken), then the pool ended another way.
CTRL_C_AS_SHUTDOWN_TAKES_THE_LOCK = '''
import signal, sys, traceback
from pool._dispatcher import front
p = pool.ProcessPool(2, mp_context=CTX)
running = p.submit(tasks.hang)
workers = sorted(p._dispatcher.live_processes())
main = threading.main_thread().ident
where = (front.__file__, front.Dispatcher.shutdown.__code__.co_firstlineno + 2)

def in_shutdown_taking_the_lock():  # in its with, or in the lock's __enter__ under it
    frame = sys._current_frames()[main]
    return where in ((frame.f_code.co_filename, frame.f_lineno),
                     (frame.f_back.f_code.co_filename, frame.f_back.f_lineno))

def hold_then_interrupt():
    with p._dispatcher._lock:
        if not helpers.wait_until(in_shutdown_taking_the_lock, 30):
            print("NEVER SEEN TAKING THE LOCK", flush=True)
        signal.raise_signal(signal.SIGINT)

holder = threading.Thread(target=hold_then_interrupt)
holder.start()
try:
    p.shutdown(wait=True)
except KeyboardInterrupt as interrupt:
    frames = [(frame.f_code.co_filename, line) for frame, line
              in traceback.walk_tb(interrupt.__traceback__)]
    print("INTERRUPTED", "TAKING THE LOCK" if where in frames else frames, flush=True)
holder.join()
p.terminate_workers()  # takes the lock again
report(workers=workers, alive=[pid for pid in workers if helpers.process_exists(pid)],
       cancelled=running.cancelled(), done=running.done())
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_a_ctrl_c_as_shutdown_takes_its_lock_leaves_the_pool_able_to_end(method, tmp_path):
    facts, proc = run_script(CTRL_C_AS_SHUTDOWN_TAKES_THE_LOCK, method, tmp_path, timeout=60)
    assert "INTERRUPTED TAKING THE LOCK" in proc.stdout  # where it was made to land
    assert len(facts["workers"]) == 1 and facts["alive"] == []
    assert facts["done"] and facts["children_left"] == [] and facts["threads_left"] == []


# A Ctrl-C inside the first submit's start of the loop's thread, made to land before the
# thread was made, after it began, as the exit hooks are registered, and as the lifeline
# the workers inherit is opened. Each time, the start is undone whole: a thread that began
# returns without running the loop, the next submit starts the one thread that runs it,
# and shutdown ends.
CTRL_C_IN_THE_FIRST_START = """
from pool import _exit
from pool._dispatcher import perform
real_start, real_hook, real_open = (threading.Thread.start, _exit.shut_down_at_exit,
                                    perform.Performer.open)
interrupted = []

def start(thread):
    if WHERE.endswith("start") and thread.name.startswith("pool-dispatcher") and not interrupted:
        interrupted.append(thread)
        if WHERE == "after start":
            real_start(thread)
        raise KeyboardInterrupt
    real_start(thread)

def hook(dispatcher):
    if WHERE == "exit hook" and not interrupted:
        interrupted.append(None)
        raise KeyboardInterrupt
    real_hook(dispatcher)

def open_lifeline(performer, wakeup):
    if WHERE == "lifeline" and not interrupted:
        interrupted.append(None)
        raise KeyboardInterrupt
    real_open(performer, wakeup)

threading.Thread.start = start
_exit.shut_down_at_exit = hook
perform.Performer.open = open_lifeline
p = pool.ProcessPool(2, mp_context=CTX)
try:
    p.submit(tasks.identity, 0)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
results = [p.submit(tasks.square, x).result(timeout=60) for x in range(4)]
first = interrupted[0]
if first is not None and first.ident is not None:
    first.join(30)  # disowned: it returns as soon as it may look
loops = [t.name for t in threading.enumerate()
         if t.name.startswith("pool-dispatcher") and "-callbacks" not in t.name]
workers = sorted(p._dispatcher.live_processes())
p.shutdown(wait=True)
report(results=results, loops=loops, workers=workers,
       alive=[pid for pid in workers if helpers.process_exists(pid)],
       first_alive=first is not None and first.is_alive(),
       first_kept=first is not None and p._dispatcher.thread is first)
"""


@pytest.mark.parametrize("where", ["before start", "after start", "exit hook", "lifeline"])
@pytest.mark.parametrize("method", START_METHODS)
def test_a_ctrl_c_in_the_first_start_leaves_one_thread_on_the_loop(where, method, tmp_path):
    body = CTRL_C_IN_THE_FIRST_START.replace("WHERE", repr(where))
    facts, proc = run_script(body, method, tmp_path, timeout=60)
    assert "INTERRUPTED" in proc.stdout
    assert facts["results"] == [0, 1, 4, 9]
    assert len(facts["loops"]) == 1 and facts["workers"] and facts["alive"] == []
    assert not facts["first_alive"] and not facts["first_kept"]
    assert facts["children_left"] == [] and facts["threads_left"] == []

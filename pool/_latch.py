"""How a thread waits for another so that a Ctrl-C always interrupts the wait: the
``Latch``, and ``join_interruptibly`` for a thread's end.

Owns: nothing shared; each latch is its own C lock.
Runs in: any thread. Callers wait on latches in ``PoolFuture.result()``, ``Dispatcher.join``
and the like; the dispatcher thread sets them.
Guarantees: a waiter takes nothing the setter needs, so a KeyboardInterrupt in a wait
cannot leave a lock taken for the setter to block on (DESIGN.md, contract 9). A wait wakes
at least every ``SIGNAL_CHECK_SECONDS``, so a pending Ctrl-C is raised within that time.
Assumes: a ``threading.Lock`` may be released by a thread that did not acquire it.
"""

from __future__ import annotations

import threading
import time

from . import _shake

# A thread blocked on a lock without a timeout can miss a Ctrl-C for good. If SIGINT lands
# after the interpreter's last check for pending signals and before the thread sleeps, the
# signal is consumed and nothing wakes the thread to raise KeyboardInterrupt. Seen here in
# about one run in five when the signal follows the call closely. So waits that may block
# for long wake up this often, to let a pending KeyboardInterrupt be raised.
SIGNAL_CHECK_SECONDS = 0.25


class Latch:
    """Set once, waited for by any number of threads, through nothing but a C lock.

    A KeyboardInterrupt can land inside a Python-level ``__enter__``, such as
    ``threading.Condition.__enter__``, just after the lock under it was taken. That lock
    then stays taken for good, and a dispatcher that needs it blocks for ever. Seen once in
    about 40 runs of the Ctrl-C-during-shutdown test: the dispatcher, in
    ``Future.set_result``, waited for the event of a ``concurrent.futures.wait`` that the
    Ctrl-C had interrupted. Waiting on a latch takes nothing the setter needs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.is_set = False

    def set(self) -> None:
        if not self.is_set:
            self.is_set = True
            try:
                self._lock.release()
            except RuntimeError:
                pass  # set twice at once

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False if ``timeout`` passed first. Wakes up every
        SIGNAL_CHECK_SECONDS, so that a Ctrl-C is never missed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set:
            left = SIGNAL_CHECK_SECONDS if deadline is None else min(
                SIGNAL_CHECK_SECONDS, deadline - time.monotonic())
            if left <= 0:
                return False
            if self._lock.acquire(True, left):
                self._lock.release()  # if a Ctrl-C lands right here, is_set still says so
            if _shake.on:
                _shake.pause("latch.between_slices")
        return True


def join_interruptibly(thread: threading.Thread) -> None:
    """``thread.join()`` that a Ctrl-C always interrupts (see SIGNAL_CHECK_SECONDS). After
    a KeyboardInterrupt, do not trust it again: 3.11 may then mark the thread stopped."""
    while thread.is_alive():
        thread.join(SIGNAL_CHECK_SECONDS)

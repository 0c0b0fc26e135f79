"""A lock that a Ctrl-C cannot leave taken: ``InterruptSafeLock``.

Owns: nothing shared; each lock is its own C re-entrant lock.
Runs in: any thread. It matters in the main thread, the only one where Python runs signal
handlers, and so the only one where a KeyboardInterrupt can land.
Guarantees: ``with lock:`` either takes the lock and gives it back, or raises without
holding it, wherever a KeyboardInterrupt lands: while waiting, just after the lock was
taken, or in the body.
Assumes: CPython runs a signal handler only at the checks the interpreter makes on
function entry, backward jumps and after calls of C functions, never inside a C call; the
``with`` statement runs a C ``__exit__`` to its end once its body started. (A profiler or
tracer that runs Python code at calls and returns adds checks of its own; not covered.)
"""

from __future__ import annotations

from ._compat import RLock


# typeshed marks the C RLock final; it is subclassable on 3.11 to 3.15 (tests/test_locks.py).
class InterruptSafeLock(RLock):  # type: ignore[misc]
    """A ``threading.RLock`` whose ``with`` never leaks it to a KeyboardInterrupt.

    A C lock in a ``with`` is not safe on Python 3.14: ``with`` calls ``__enter__`` with an
    ordinary call, and the interpreter checks for pending signals just after a C call
    returns, before the block that would give the lock back begins. A Ctrl-C that arrives
    while the lock is being taken is then raised with the lock held, and held for good.
    (3.11 to 3.13 and 3.15 enter a plain ``with`` without that check; on every version the
    same happens to code that calls ``acquire()`` itself before its ``try``, and to a
    ``threading.Condition`` over a C lock, whose ``__enter__`` is a Python function that
    calls the lock's.) Here ``__enter__`` is a Python function, which a ``with`` enters and
    leaves with no such check, so it can give the lock back before it lets the interrupt
    go on; ``__exit__`` stays the C one, which releases before any check. A condition over
    this lock is safe too: its ``__enter__`` calls this one.

    Re-entrant, as ``threading.RLock``: where a plain ``Lock`` was replaced, a thread that
    takes it twice no longer deadlocks itself, and only the thread that took it may
    release it.

    Seen as a hang: a Ctrl-C while ``shutdown(wait=True)`` took the dispatcher's lock left it
    taken, and the exit hook's own ``shutdown()`` then waited for it for ever.
    """

    __slots__ = ()

    def __enter__(self) -> bool:  # type: ignore[override]  # (a with passes nothing)
        try:
            return self.acquire()
        except BaseException:
            # Either the wait was interrupted (not taken: release raises) or the interrupt
            # was raised just after the lock was taken (taken: give it back). No signal
            # check runs between here and the release call.
            try:
                self.release()
            except RuntimeError:
                pass
            raise

    def try_acquire(self, timeout: float) -> bool:
        """``acquire(timeout=timeout)``, for waits taken in slices, with ``__enter__``'s
        promise: an interrupt either leaves the lock as it was or is raised after giving it
        back. On True, the caller's ``try: ... finally: lock.release()`` must follow at
        once: a return from a Python function checks for no signal, so none is raised in
        between."""
        try:
            return self.acquire(True, timeout)
        except BaseException:
            try:
                self.release()
            except RuntimeError:
                pass
            raise

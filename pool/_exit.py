"""The pool and the life of its process: interpreter exit, and fork.

Owns: the set of live dispatchers, the exit hook and the at-fork hook.
Runs in: the thread that runs the interpreter's exit hooks; a forked child's only thread;
dispatchers registering or leaving, from their own threads.
Guarantees:
- at a normal exit every pool still open finishes its submitted work and reaps its workers
  before the interpreter goes on (the stdlib's promise); after that, submissions are
  refused. A callback that blocks does not hold the exit for more than ``stop`` grace;
- at an exit caused by an unhandled ``KeyboardInterrupt``, or when Ctrl-C interrupts that
  wait, nothing more is waited for: queued tasks are cancelled, running ones terminated
  (SIGTERM, then SIGKILL), and every worker reaped;
- if the exit hook was cut short (a Ctrl-C at its first line, which threading prints as
  ignored, or another of threading's hooks raised before it), atexit's safety net stops
  every pool still live, as after a Ctrl-C: it terminates, it does not wait;
- a child forked from a pool's process (``os.fork``, ``multiprocessing``'s fork) closes its
  copies of the pool's lifeline and task pipes at once, so it cannot keep workers alive; a
  worker the dispatcher itself forks is left alone (it closes what it must itself);
- such a child can make forkserver pools of its own: it forgets the parent's forkserver
  (see ``_close_in_child``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from typing import Any

from . import _compat, _shake

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False
_registered_at_fork = False
interpreter_exiting = False


def _exiting_after_interrupt() -> bool:
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return isinstance(last, KeyboardInterrupt)


def _shut_down_all() -> None:
    """The exit hook, before threads are joined: finish every pool's work (or, after a
    Ctrl-C, stop it), and reap every worker."""
    global interpreter_exiting
    interpreter_exiting = True
    if not _live:
        # Every pool has ended already (the command line ends its own): nothing to do,
        # and no first line for a late Ctrl-C to interrupt (found by the shake: one that
        # landed in an ended command line's exit was printed as ignored by threading).
        return
    if _shake.on:
        _shake.pause("exit.hook_entry")
    try:
        if _shake.on:
            _shake.pause("exit.before_pools")
        interrupted = _exiting_after_interrupt()
        for dispatcher in list(_live):
            if interrupted:
                dispatcher.terminate(signal.SIGTERM, wait=False)
            else:
                dispatcher.shutdown(wait=False, cancel_futures=False)
            dispatcher.join(callback_timeout=dispatcher.stop_grace)
    except KeyboardInterrupt:  # Ctrl-C while waiting at exit: stop waiting for tasks
        _stop_all_now()


def _stop_all_now() -> None:
    """Cancel what has not started, terminate what runs, and reap every worker, of every
    pool still live."""
    dispatchers = list(_live)
    for dispatcher in dispatchers:
        dispatcher.terminate(signal.SIGTERM, wait=False)
    for dispatcher in dispatchers:
        dispatcher.join(callback_timeout=0)


def _stop_what_the_hook_left() -> None:
    """atexit's, after threading's hooks. A Ctrl-C can land in ``_shut_down_all`` before its
    ``try``, as any Python function can be interrupted at its first line. threading then
    prints it as ignored and skips the hook: the pools would be left to the lifelines,
    their futures never resolved (found by the shake, with a delay there). Once the hook
    has run, no pool is left live and this does nothing."""
    global interpreter_exiting
    interpreter_exiting = True   # (the hook may not have got to it): refuse submissions
    if _live:
        _stop_all_now()


def _close_in_child() -> None:
    current = threading.current_thread()
    for dispatcher in list(_live):
        if dispatcher.thread is current:
            return  # a worker being started: it closes its inherited descriptors itself
    for dispatcher in list(_live):
        dispatcher.close_in_forked_child()
    _live.clear()
    # multiprocessing's forkserver handle, copied from the parent, names a server the child
    # did not start, and ``ensure_running()`` checks it with ``waitpid``, which fails here
    # with ``ChildProcessError``: no forkserver pool could start a worker in the child, the
    # stdlib's neither. Forgotten, the child's first forkserver worker starts a server of
    # the child's own; the child's copy of the old server's lifeline is closed, or it
    # would keep that server running as long as the child lives.
    _compat.forget_inherited_forkserver()


def shut_down_at_exit(dispatcher: Any) -> None:
    """Remember a dispatcher whose thread is about to start; register the hooks once. A
    dispatcher whose thread then did not start is remembered harmlessly: its shutdown
    ends at once. Each hook is marked registered only once it is, so that a Ctrl-C in
    here leaves the rest for the next call, never skipped for good."""
    global _registered, _registered_at_fork
    _live.add(dispatcher)
    if _registered:
        return
    if not _registered_at_fork:
        os.register_at_fork(after_in_child=_close_in_child)
        _registered_at_fork = True
    # threading's own exit hooks run before non-daemon threads are joined (the stdlib's
    # executors use them too), so a thread waiting for a result does not hold up the exit.
    import atexit
    try:
        _compat.register_before_threads_joined(_shut_down_all)
    except RuntimeError:  # too late for threading's hooks: use atexit's
        atexit.register(_shut_down_all)
    else:
        atexit.register(_stop_what_the_hook_left)
    _registered = True


def forget(dispatcher: Any) -> None:
    _live.discard(dispatcher)


def forget_all() -> None:
    """In a worker forked from the pool's process: the parent's pools are not ours (their
    descriptors are closed already; the numbers may be reused)."""
    _live.clear()

"""Interpreter exit: pools still open are shut down, as ``ProcessPoolExecutor``'s are.

Owns: the set of live dispatchers and the exit hook. Runs in: the thread that runs the
interpreter's exit hooks (and dispatchers registering or leaving, from their own threads).
Guarantees: at a normal exit every pool still open finishes its submitted work and reaps
its workers before the interpreter goes on; after that, new submissions are refused.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False
interpreter_exiting = False


def _shut_down_all() -> None:
    global interpreter_exiting
    interpreter_exiting = True
    for dispatcher in list(_live):
        dispatcher.shutdown(wait=True, cancel_futures=False)


def shut_down_at_exit(dispatcher: Any) -> None:
    """Remember a dispatcher whose thread just started; register the hook once."""
    global _registered
    _live.add(dispatcher)
    if _registered:
        return
    _registered = True
    # threading's own exit hooks run before non-daemon threads are joined (the stdlib's
    # executors use them too), so a thread waiting for a result does not hold up the exit.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_shut_down_all)
    except RuntimeError:  # too late for threading's hooks: use atexit's
        import atexit
        atexit.register(_shut_down_all)


def forget(dispatcher: Any) -> None:
    _live.discard(dispatcher)

"""Every private name of the standard library that pool relies on, in one place.

Owns: one small accessor per private name (a name starting with ``_``, or any name of a
private module such as ``concurrent.futures._base``), each with why pool needs it and the
Pythons it was checked on. ``tests/test_compat.py`` runs each on the running Python, and
``tests/test_imports.py`` fails if any other module of pool reaches such a name.
Runs in: any thread of the parent, and every worker (``_exit`` imports it).
Guarantees: importing it imports nothing a pool's process has not imported already
(``sys``, ``os``, ``threading``, ``_thread``); an accessor imports what it reads
(``concurrent.futures``, ``multiprocessing.util``, ``atexit``) only when it is called, so
a worker, which calls none of those, pays for none of them.
Assumes: the names are as checked on CPython 3.11 to 3.15. Where a name may be missing on
another Python, the accessor says what it does then.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

if TYPE_CHECKING:
    import logging
    from concurrent.futures import Future
    from types import FrameType


# -- threads and frames ---------------------------------------------------------------------

# The C re-entrant lock type. ``threading.RLock`` is a Python function that returns one:
# ``PoolFuture`` makes a lock for every task and calls the type itself.
# Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (``threading._CRLock`` is this type on each).
RLock = _thread.RLock


def register_before_threads_joined(function: Callable[[], object]) -> None:
    """Run ``function`` at interpreter exit before the non-daemon threads are joined
    (``threading._register_atexit``, which the stdlib's executors use too): the pools end
    there, so a thread waiting for a result does not hold up the exit. Raises
    ``RuntimeError`` where that is not possible: the hook is missing, or the interpreter is
    already past those hooks.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        raise RuntimeError("no threading._register_atexit")
    register(function)


def run_atexit_functions() -> None:
    """Run the functions registered with ``atexit`` now (``atexit._run_exitfuncs``):
    ``python -m pool map`` stopped by a signal ends itself by that signal, which skips the
    interpreter's exit, so it runs them first (multiprocessing removes its temporary
    directory there).

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    import atexit
    atexit._run_exitfuncs()


def calling_frame() -> FrameType:
    """The frame of the function that calls this one (``sys._getframe(1)``): the check for
    a main script without its ``__main__`` guard walks up the stack from there.
    ``inspect.currentframe`` does the same, but importing ``inspect`` would cost every
    worker that imports the executor (under spawn and forkserver, every one).

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    return sys._getframe(1)


# -- concurrent.futures ---------------------------------------------------------------------

class FutureStates(NamedTuple):
    """The states of a ``concurrent.futures.Future``, as its ``_state`` holds them."""
    pending: str
    running: str
    cancelled: str
    cancelled_and_notified: str
    finished: str


_future_states: FutureStates | None = None


def future_states() -> FutureStates:
    """``concurrent.futures._base``'s state constants. ``PoolFuture`` keeps its state where
    ``Future`` keeps it, in these values, because the stdlib's ``wait`` and
    ``as_completed`` read it there.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (the same five strings on each)."""
    global _future_states
    if _future_states is None:
        from concurrent.futures import _base
        _future_states = FutureStates(_base.PENDING, _base.RUNNING, _base.CANCELLED,
                                      _base.CANCELLED_AND_NOTIFIED, _base.FINISHED)
    return _future_states


def future_state_description(state: str) -> str:
    """How ``Future.__repr__`` words a state (``_base._STATE_TO_DESCRIPTION_MAP``), so that
    a ``PoolFuture`` shows as a ``Future`` does.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    from concurrent.futures import _base
    return _base._STATE_TO_DESCRIPTION_MAP[state]


def futures_logger() -> logging.Logger:
    """The logger ``Future`` reports a failing done-callback to (``_base.LOGGER``, the
    ``concurrent.futures`` logger): ``PoolFuture`` reports to the same one, where a
    program that watches the stdlib's looks. Read at each call, as ``Future`` does.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    from concurrent.futures import _base
    return _base.LOGGER


def done_future_cancelled(future: Future[Any]) -> bool:
    """Whether a future that is done was cancelled, read from its ``_state`` without its
    lock (final once the future is done): the progress count runs in the callback of any
    ``Future``, the stdlib's too, and must not take a lock there.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    states = future_states()
    return future._state in (states.cancelled, states.cancelled_and_notified)


def death_cause(pid: int, exitcode: int | None) -> BaseException | None:
    """What the stdlib gives a ``BrokenProcessPool`` as ``__cause__`` when a worker died,
    from 3.15 on (gh-139462): a ``concurrent.futures.process._RemoteTraceback`` whose text
    names the process and its exit code (negative for a signal, as ``Process.exitcode``).
    Code written for 3.15 may read it, so ``WorkerDied`` has it there too; before 3.15
    the stdlib sets none, and neither does pool. None where the class is missing.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (before 3.15 the class is there, unused for
    deaths)."""
    if sys.version_info < (3, 15) or exitcode in (None, 0):
        return None  # (the stdlib names only processes with a non-zero exit code)
    from concurrent.futures import process
    remote_traceback = getattr(process, "_RemoteTraceback", None)
    if remote_traceback is None:
        return None
    cause: BaseException = remote_traceback(
        f"\n'''\nProcess {pid} terminated abruptly with exit code {exitcode}'''")
    return cause


# -- multiprocessing ------------------------------------------------------------------------

def process_target(process: Any) -> Any:
    """The ``target`` a ``multiprocessing.Process`` was made with (``BaseProcess._target``):
    in a process a forkserver forked, whether it is one of pool's workers.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    return getattr(process, "_target", None)


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, if it is not running. spawn and
    forkserver start it at their first ``Process.start()``, blocking SIGINT and SIGTERM
    while it starts (so that it cannot die of a Ctrl-C); afterwards 3.11 to 3.13 unblock
    both in the calling thread, whatever it blocked before, and 3.14 and 3.15 restore the
    thread's mask. A caller that blocks signals around a start calls this first, so that
    its block holds on every version.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (``resource_tracker.ensure_running``)."""
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver; None while it has none (never started, or
    forgotten in a forked child). Read after a worker's start, to know that the worker is
    the server's child, not ours; and before the first, to know whether the preload list
    can still change. (``forkserver._forkserver._forkserver_pid``.)

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    from multiprocessing import forkserver
    pid: int | None = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid


def forkserver_preload() -> list[str]:
    """The modules the forkserver will import before it forks any worker
    (``forkserver._forkserver._preload_modules``; ``["__main__"]`` unless the program set
    it), so that pool adds its own after them, not in their place.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    from multiprocessing import forkserver
    return list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))


def forget_inherited_forkserver() -> None:
    """In a forked child: forget the forkserver the parent started, keeping its preload
    list, so that the child's first forkserver worker starts a server of the child's own;
    and close the child's copy of the server's lifeline. The handle is made anew
    (``_ForkServer.__init__``: its lock too, which another thread may have held at the
    fork). Does nothing if ``multiprocessing.forkserver`` was never imported, or started
    no server.

    Reaches ``forkserver._forkserver`` and its ``_forkserver_pid``, ``_preload_modules``
    and ``_forkserver_alive_fd``. Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (3.14 adds
    ``_forkserver_authkey`` and 3.15 ``_preload_on_error``: both go back to their
    defaults, as the lock does; only the preload list is kept)."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is None:
        return  # the parent started none
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    preload = getattr(server, "_preload_modules", None)
    server.__init__()
    if preload is not None:
        server._preload_modules = preload
    if alive_fd is not None:
        try:
            os.close(alive_fd)
        except OSError:
            pass


def starting_as_spawned_worker() -> bool:
    """Whether this process is a spawn or forkserver worker still importing its parent's
    main script (``multiprocessing.current_process()._inheriting``, set while it does): a
    pool made at that script's top level would start workers of its own.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (``multiprocessing.spawn`` sets it on each)."""
    import multiprocessing
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


# The pipes multiprocessing's fork Popen opens before it forks, by the names its ``_launch``
# gives them. Should the names change, nothing is found and the pipes stay open, as they
# would without pool.
_FORK_LAUNCH_PIPES = ("parent_r", "child_w", "child_r", "parent_w")


def pipes_of_failed_fork(exc: BaseException) -> list[int]:
    """The descriptors that a fork ``Process.start()`` which raised ``exc`` left open:
    when ``os.fork()`` fails (EAGAIN: out of processes), ``Popen._launch`` has opened its
    pipes and closes none of them, four descriptors per refused start. They are read from
    the ``_launch`` frame in the traceback, only when fork itself raised (no pid yet).

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (the four names in ``popen_fork``)."""
    found: list[int] = []
    traceback_ = exc.__traceback__
    while traceback_ is not None:
        frame = traceback_.tb_frame
        if (frame.f_code.co_name == "_launch"
                and frame.f_code.co_filename.endswith("popen_fork.py")
                and getattr(frame.f_locals.get("self"), "pid", None) is None):
            found += [fd for name in _FORK_LAUNCH_PIPES
                      if isinstance(fd := frame.f_locals.get(name), int)]
        traceback_ = traceback_.tb_next
    return found


def forget_child_process(process: Any) -> None:
    """Drop ``process`` from the children multiprocessing joins at interpreter exit
    (``multiprocessing.process._children``): a process the pool could not reap would hang
    that exit. Does nothing where the set is not there.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (a ``set`` on each)."""
    from multiprocessing import process as process_module
    children = getattr(process_module, "_children", None)
    if isinstance(children, set):
        children.discard(process)


def close_process_popen(process: Any) -> None:
    """Close the descriptors of a reaped process's popen (``Process._popen``) now, rather
    than when the ``Process`` is collected, without closing the ``Process`` itself: code
    that took it from ``executor._processes`` may still read it.

    Checked on 3.11, 3.12, 3.13, 3.14, 3.15."""
    popen = getattr(process, "_popen", None)
    if popen is not None and hasattr(popen, "close"):
        popen.close()


# multiprocessing flushes the parent's standard streams before it starts any process:
# ``Popen.__init__`` calls ``multiprocessing.util._flush_std_streams``. On the
# dispatcher thread that would block the whole pool for as long as the program's own
# output is blocked (a full pipe, a paused pager): no reply delivered, no death seen, no
# timeout fired. The pool has no need of it: a forked worker drops what it inherited
# unwritten (``_worker.streams.drop_inherited_output``), a spawned one inherits nothing.
#
# The stdlib offers no way to skip it for one start, so the function is replaced, once,
# at the pool's first worker start, by one that skips the flush only for a start made
# inside ``std_streams_left_unflushed()``, on that thread, in that process (a forked
# child keeps a copy of the starting thread's state: keyed by pid too). Every other start,
# on any thread, flushes as before. Swapping the function only around the pool's own
# starts would not be safer: the swap is seen by every thread, so a start on another
# thread at that moment would skip its flush, and putting the old function back would
# undo whatever another library installed meanwhile.
# Checked on 3.11, 3.12, 3.13, 3.14, 3.15 (the same ``Popen.__init__`` on each).
_starting_worker = threading.local()
_flush_filter_installed = False


def _install_flush_filter() -> None:
    global _flush_filter_installed
    if _flush_filter_installed:
        return
    from multiprocessing import util
    flush = getattr(util, "_flush_std_streams", None)
    # A Python without it does not flush there: nothing to skip.
    if flush is not None:

        def flush_unless_the_pool_starts_a_worker() -> None:
            if getattr(_starting_worker, "pid", None) != os.getpid():
                flush()

        # Two pools' first starts at once may both get here: the second filter then
        # wraps the first, which only checks twice.
        util._flush_std_streams = (  # type: ignore[attr-defined]
            flush_unless_the_pool_starts_a_worker)
    _flush_filter_installed = True


class _UnflushedStart:
    def __enter__(self) -> None:
        _install_flush_filter()
        _starting_worker.pid = os.getpid()

    def __exit__(self, *exc_info: object) -> None:
        _starting_worker.pid = None


def std_streams_left_unflushed() -> _UnflushedStart:
    """``with std_streams_left_unflushed(): process.start()``: multiprocessing does not
    flush this process's standard streams before that start (see above)."""
    return _UnflushedStart()

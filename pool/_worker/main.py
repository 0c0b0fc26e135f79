"""A worker process's main: receive a call, run it, send the outcome back, repeat.

Owns: its task pipe (read end), its reply pipe (write end), its crash-report file, its
progress file (``progress``), its lifeline and its own process group. Nothing else: it
never touches another worker.
Runs in: the worker process. The main thread runs tasks; a watchdog thread only waits for
the parent to go away.
Guarantees:
- a fatal error (segfault, abort, fatal Python error) leaves the Python stack of every
  thread in the crash-report file, which the parent reads after the death;
- every task gets exactly one reply frame, whatever it returns or raises, unless the
  process dies while running it;
- when the parent dies, however it dies, the lifeline pipe hangs up and the worker kills
  its process group at once: itself and any processes its tasks started;
- ``DUMP_SIGNAL``, sent when a task overruns its timeout, makes it write the stack of every
  thread into the crash-report file, then die of that signal. This runs in C, without the
  GIL, so the parent knows the stack is complete when it sees the exit;
- with ``max_memory``, a worker whose resident memory is above it after a task says so
  (``OVER_MEMORY``) before the reply, so the parent sends it nothing more;
- end of file on the task pipe means "stop": the worker exits normally, so buffered
  output is flushed and atexit handlers run.
Assumes: it is started by the dispatcher through ``multiprocessing`` with the descriptors
of ``WorkerSetup``. Under ``fork`` it also inherited the parent's other pool descriptors,
listed in ``fds_to_close``; it closes them first.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import pickle
import select
import signal
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable

import multiprocessing
from multiprocessing import context as _context
from multiprocessing import reduction
from multiprocessing import util as _util

from .. import _compat, _exit, _platform, _shake
from .._wire import exceptions as _exceptions, frames as _frames, pickling as _pickling
from .._wire import loans as _loans, pipes as _pipes, shared_calls as _shared_calls
from .streams import drop_inherited_output
from .._wire.frames import Kind

# The signals a terminal or a service manager sends a program's whole process group to
# stop it. Every process pool starts starts with them blocked (see
# ``handle._start_holding_stop_signals``): the parent decides what they mean.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def _give_back_stop_signals(_: object) -> None:
    """multiprocessing's after-fork hook, in every process started from a process that
    imported this module, once its ``Process`` is current. A forkserver that pool
    launched imported it (it is among its preloads) and keeps the stop signals blocked
    for good; what it forks for others (the stdlib's executors, a user's ``Process``)
    gets them back here, as from any other forkserver: else ``terminate()`` could not
    end it, nor Ctrl-C reach it. A pool worker keeps them blocked until ``worker_main``
    ignores SIGINT."""
    if (multiprocessing.get_start_method(allow_none=True) == "forkserver"
            and _compat.process_target(multiprocessing.current_process()) is not worker_main):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


# The reply pipe of this worker and the id of the task it runs, for tests that must write
# into that pipe themselves (garbage, or a reply followed by a death).
_reply_fd: int | None = None
_current_task_id = 0


# This worker's progress file, taken by ``progress`` at the first chunk that records its
# items (that module is imported only then: a worker that runs none does not pay for it):
# the descriptor, whether it is memory (a memfd, mapped) or a file on disk, and the pid it
# belongs to (a process forked from this worker inherits these, and must not use them).
_progress_fd: int | None = None
_progress_in_memory = False
_progress_pid = 0


def current_task_id() -> int:
    """The id of the task this worker is running (a chunk records its items under it)."""
    return _current_task_id

# Sent by the parent when a task overruns its timeout. Not SIGUSR1: users commonly
# register faulthandler on that one for their own dumps.
DUMP_SIGNAL = signal.SIGUSR2


class InheritedFd:
    """A file descriptor handed to a worker under any start method.

    Under ``fork`` the worker inherits the number itself. Under ``spawn`` and ``forkserver``
    the Process object is pickled, and this reduces through multiprocessing's own
    descriptor passing, which hands a ``Connection`` to a child.
    """

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup: Any) -> InheritedFd:
    return InheritedFd(dup.detach())


class Initializer:
    """The user's ``initializer`` and ``initargs``, as they travel to every worker.

    The arguments travel inside the Process object, as the stdlib sends them. Under fork
    they are inherited as they are. Under spawn and forkserver, multiprocessing pickles them
    while it starts the process: the one moment at which its locks, queues, events, shared
    values and pipes may be pickled ("shared through inheritance"). Plain data, which
    pickles the same at any time, is pickled once, here: no worker start pickles it again
    or runs its reducers on the pool's thread. Arguments that only cloudpickle can send,
    such as a lambda or a ``__main__`` object under spawn, travel by value. The function is
    pickled in advance, by value where workers cannot import it.
    """

    __slots__ = ("function", "args")

    def __init__(self, function: bytes, args: tuple[Any, ...]) -> None:
        self.function = function  # _pickling.dumps_callable(initializer)
        self.args = args          # see prepare_initargs

    def call(self) -> None:
        """Run it (in the worker)."""
        args = [arg.load() if isinstance(arg, _ByValue) else arg for arg in self.args]
        pickle.loads(self.function)(*args)


class _ByValue:
    """An initarg pickled once, in the constructor."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def load(self) -> Any:
        return pickle.loads(self.blob)


def prepare_initargs(args: tuple[Any, ...], ctx: Any) -> tuple[Any, ...]:
    """``initargs`` as they will travel (see ``Initializer``). Raises
    ``ArgumentPicklingError`` now, in the constructor, for one that could not be sent to a
    worker that ``ctx`` starts."""
    if ctx.get_start_method() == "fork":
        return args  # inherited as they are: nothing is pickled
    prepared = []
    for index, arg in enumerate(args):
        try:
            at_start: bytes | None = _pickled_at_start(arg)
        except Exception as exc:
            at_start, why = None, exc
        try:
            now: bytes | None = pickle.dumps(arg, pickle.DEFAULT_PROTOCOL)
        except Exception:
            now = None
        if now is not None and now == at_start:
            prepared.append(_ByValue(now))  # plain data: the same bytes whenever pickled
        elif at_start is not None:
            prepared.append(arg)  # shared through inheritance: pickled at each start
        else:
            import cloudpickle
            try:
                prepared.append(_ByValue(cloudpickle.dumps(arg, pickle.DEFAULT_PROTOCOL)))
            except Exception:
                raise _initarg_error(index, arg, why, ctx) from why
    return tuple(prepared)


def _pickled_at_start(arg: Any) -> bytes:
    """What multiprocessing will make of ``arg`` when it starts a process, tried with a
    stand-in for that process: descriptors are 'passed' by number, and the pickle is thrown
    away. So objects that may be pickled only while a process starts are accepted."""
    spawning = _context.get_spawning_popen()
    _context.set_spawning_popen(_TrialStart())  # type: ignore[arg-type]  # duck-typed
    try:
        return bytes(reduction.ForkingPickler.dumps(arg))
    finally:
        _context.set_spawning_popen(spawning)


def _initarg_error(index: int, arg: Any, why: BaseException, ctx: Any) -> BaseException:
    method = ctx.get_start_method()
    message = (f"initargs[{index}] (a {type(arg).__qualname__}) cannot be sent to workers "
               f"started by {method!r}: {type(why).__name__}: {why}")
    if "fork context" in str(why):
        message += (f". Create it from the pool's context: multiprocessing.get_context("
                    f"{method!r}).Lock() (and so on; on Python 3.13 and earlier the default "
                    f"context is 'fork'), or pass mp_context=multiprocessing.get_context("
                    f"\"fork\") to the pool")
    from .._errors import argument_pickling_error
    return argument_pickling_error(message, why)


class _TrialStart:
    """Stands for the process being started in ``_pickled_at_start``: descriptors are
    'passed' by number only, and the trial's pickle is thrown away."""

    def duplicate_for_child(self, fd: int) -> int:
        return fd

    def DupFd(self, fd: int) -> None:
        return None


class WorkerSetup:
    """Everything a worker needs, built by the dispatcher and passed as the Process arg."""

    def __init__(self, *, task_fd: InheritedFd, reply_fd: InheritedFd, lifeline_fd: InheritedFd,
                 crash_fd: InheritedFd | None, initializer: Initializer | None,
                 max_tasks: int | None, max_memory: int | None,
                 fds_to_close: tuple[int, ...], forked: bool = False,
                 portable: bool = False, progress_fd: InheritedFd | None = None,
                 progress_in_memory: bool = False,
                 desk: tuple[int, int] | None = None) -> None:
        self.task_fd = task_fd
        self.reply_fd = reply_fd
        self.lifeline_fd = lifeline_fd
        self.crash_fd = crash_fd
        self.progress_fd = progress_fd  # where a chunk records its items (_worker.progress)
        self.progress_in_memory = progress_in_memory  # a memfd (else a file on disk)
        # The parent's pid and its descriptor of this worker's loan desk (_wire.loans).
        self.desk = desk
        self.initializer = initializer
        self.max_tasks = max_tasks
        self.max_memory = max_memory  # bytes of resident memory, or None
        self.fds_to_close = fds_to_close
        self.forked = forked  # started by fork: a copy of the parent, buffers and all
        # The parent's POOL_PORTABLE, which the worker adopts: a forkserver started by a
        # program that changed its environment since may have read another one.
        self.portable = portable


def worker_main(setup: WorkerSetup) -> None:
    """The ``target`` of every worker Process."""
    global _reply_fd
    _platform.adopt(setup.portable)
    if setup.forked:
        drop_inherited_output()
    for fd in setup.fds_to_close:  # only under fork: the parent's other pool descriptors
        try:
            os.close(fd)
        except OSError:
            pass
    _exit.forget_all()  # under fork, the parent's pools were copied into this process
    task_fd, reply_fd = setup.task_fd.fd, setup.reply_fd.fd
    _reply_fd = reply_fd
    _become_group_leader()
    # Ctrl-C in a terminal reaches the whole foreground group; the parent decides what a
    # KeyboardInterrupt means, so workers neither die of it nor print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Started with the stop signals blocked (``handle._start_holding_stop_signals``): now
    # that SIGINT is ignored, a Ctrl-C that came during the start is dropped, a SIGTERM or
    # SIGHUP ends the worker now, and what the task starts gets the usual mask.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    signal.signal(DUMP_SIGNAL, signal.SIG_DFL)  # its default action ends the process
    if setup.crash_fd is not None:  # None: the parent could not make one; no stacks then
        faulthandler.enable(file=setup.crash_fd.fd, all_threads=True)
        # Dump every thread's stack, then chain to the default action (termination): the
        # parent sees the exit only once the stack is written.
        faulthandler.register(DUMP_SIGNAL, file=setup.crash_fd.fd, all_threads=True,
                              chain=True)
    global _progress_fd, _progress_in_memory, _progress_pid
    _progress_fd = None if setup.progress_fd is None else setup.progress_fd.fd
    _progress_in_memory, _progress_pid = setup.progress_in_memory, os.getpid()
    if setup.desk is not None:  # where the parent lends segments for large results
        _loans.worker_desk = _loans.WorkerDesk(*setup.desk)
    threading.Thread(target=_watch_parent, name="pool-worker-watchdog", daemon=True,
                     args=(setup.lifeline_fd.fd,)).start()

    try:
        if setup.initializer is not None and not _run_initializer(setup.initializer, reply_fd):
            sys.exit(3)
        _frames.write_frame(reply_fd, Kind.READY, 0)
        _serve(task_fd, reply_fd, setup.max_tasks, setup.max_memory)
    except BrokenPipeError:
        # The parent closed our reply pipe: it is gone or giving up on us. Even as the
        # worker starts (found by the shake: a parent SIGKILLed while a spawned worker
        # started, whose READY then printed a traceback into the program's stderr).
        pass
    finally:
        faulthandler.disable()


def _become_group_leader() -> None:
    # Its own process group, so that ending a worker can end everything its task started.
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group or session leader (cannot happen under multiprocessing)


def _watch_parent(lifeline_fd: int) -> None:
    """Kill this worker's process group as soon as the parent is gone.

    The parent holds the only write end of the lifeline pipe: it closes its copy in every
    child it forks (see ``_exit``). So the pipe hangs up the moment the parent dies,
    SIGKILL included. This thread sleeps in poll() until then, with no periodic wake-ups.
    """
    # The task's thread (the main one) should be the one that takes the dump signal.
    signal.pthread_sigmask(signal.SIG_BLOCK, {DUMP_SIGNAL})
    poller = select.poll()
    poller.register(lifeline_fd, 0)  # no events asked: only POLLHUP/POLLERR are reported
    while not poller.poll():
        pass
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(70)


def _run_initializer(initializer: Initializer, reply_fd: int) -> bool:
    try:
        initializer.call()
    except BaseException as exc:
        _drop_own_frame(exc)
        # Logged where the stdlib's worker logs it, so that handlers an initializer or the
        # user put on that logger see it. The parent also gets it, with its frames.
        import logging
        logging.getLogger("concurrent.futures").critical("Exception in initializer:",
                                                         exc_info=exc)
        _frames.write_frame(reply_fd, Kind.INIT_FAILED, 0, _exceptions.encode_exception(exc))
        return False
    return True


class _FunctionCache:
    """Unpickled task functions, keyed by their pickled bytes.

    ``map`` sends the same function bytes with every chunk; unpickling them once per worker
    matters when the function travels by value (cloudpickle).
    """

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._entries: OrderedDict[bytes, Callable[..., Any]] = OrderedDict()

    def get(self, blob: bytes | memoryview) -> Callable[..., Any]:
        key = bytes(blob)
        fn = self._entries.get(key)
        if fn is None:
            fn = pickle.loads(key)
            self._entries[key] = fn
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return fn


def _serve(task_fd: int, reply_fd: int, max_tasks: int | None, max_memory: int | None) -> None:
    global _current_task_id
    functions = _FunctionCache()
    memory = _ResidentMemory() if max_memory is not None else None
    completed = 0
    stream = _frames.FrameStream(task_fd)
    room = _pipes.PipeRoom(reply_fd)
    while max_tasks is None or completed < max_tasks:
        frame = stream.next()
        if frame is None:
            return  # end of file: the parent asked us to stop
        assert frame.kind is Kind.CALL, frame.kind
        _current_task_id = frame.task_id
        kind, body = _run_call(functions, frame.body)
        del frame
        if memory is not None and max_memory is not None:
            resident = memory.bytes()
            if resident > max_memory:  # before the reply, so no further task is sent
                _frames.write_frame(reply_fd, Kind.OVER_MEMORY, _current_task_id,
                                  resident.to_bytes(8, "big"))
        room.fit(_frames.size_of(body))
        if _shake.on:
            _shake.pause("worker.before_reply")
        _frames.write_frame(reply_fd, kind, _current_task_id, body)
        del body
        completed += 1


class _ResidentMemory:
    """This process's resident set size, as cheaply as the platform allows. Without /proc
    (``_platform.PROC``), its peak: never less than the size, so a worker retires at least
    whenever the size would have retired it."""

    def __init__(self) -> None:
        self._statm: int | None = None  # not Linux: the peak, from getrusage
        if _platform.PROC:
            try:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            except OSError:
                pass

    def bytes(self) -> int:
        if self._statm is not None:
            return int(os.pread(self._statm, 128, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _run_call(functions: _FunctionCache, body: Any) -> tuple[Kind, bytes | _frames.Buffers]:
    call: _shared_calls.CallView | None = None  # the view of the call's segment, if it has one
    try:
        try:
            fn_blob, args_source, envelope = _pickling.decode_call(body)
            fn = functions.get(fn_blob)
            if envelope is not None:
                call = _shared_calls.CallView(envelope)
            args, kwargs = _pickling.load_arguments(args_source, call)
        finally:
            if isinstance(body, _frames.BodyReader):
                body.skip_rest()  # whatever happened, the next frame starts after this one
    except BaseException as exc:
        # A BrokenProcessPool, as the stdlib raises here, where its worker dies. The
        # worker's own error, with its frames, is the cause.
        from .._errors import ArgumentUnpicklingError
        error = ArgumentUnpicklingError(
            f"the worker (pid {os.getpid()}) could not unpickle the task's function or "
            f"arguments: {type(exc).__name__}: {_exceptions.safe_str(exc)}")
        error.__cause__ = exc
        outcome: tuple[Kind, bytes | _frames.Buffers] = (
            Kind.RAISED, _exceptions.encode_exception(error))
        del error, exc
    else:
        outcome = _outcome(fn, args, kwargs, copied=call is not None)
        del args, kwargs
    if call is not None:
        call.release()  # before the reply: the parent reuses the segment once it has it
    return outcome


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
             copied: bool) -> tuple[Kind, bytes | _frames.Buffers]:
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        _drop_own_frame(exc)
        return Kind.RAISED, _exceptions.encode_exception(exc)
    return _pickling.encode_result(value, copied=copied)


# What a worker runs for one ``map`` chunk. They live here, with the worker, not in
# ``_mapping`` on the caller's side. A chunk names its runner by reference, and a worker
# that had to import ``_mapping`` for it would pay for the caller's modules at its first
# chunk.

def process_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> list[Any]:
    """One ``map`` chunk over several iterables, as a single task."""
    return list(itertools.starmap(fn, chunk))


def process_items(fn: Callable[..., Any], items: list[Any]) -> list[Any]:
    """One ``map`` chunk over one iterable. The items themselves travel, not a 1-tuple
    around each: half the pickling."""
    return list(map(fn, items))


def _drop_own_frame(exc: BaseException) -> None:
    # The traceback starts in this module's frame; the user wants theirs first.
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__ and tb.tb_next:
        exc.__traceback__ = tb.tb_next


# (Registered in every process that imports this module; it acts only in a forkserver's
# children: see the function.)
_util.register_after_fork(_give_back_stop_signals, _give_back_stop_signals)

"""The parent's handle on one worker process: start it, talk to it, end it.

Owns: for one worker, its ``Process`` object and the parent's ends of its descriptors: the
task pipe's write end, and a read end of it: on Linux a non-blocking one to take back tasks
the worker has not read, elsewhere (``_platform``) a plain one that only tells how much is
unread; the reply pipe's read end, non-blocking; the crash-report file; the
progress file (``progress``); the process sentinel. Also the thread that writes a large
frame, while one does.
Runs in: the dispatcher thread only.
Guarantees:
- the dispatcher never blocks writing to a worker. Small frames always fit in the pipe. A
  large one is written by a thread of its own: a worker may stop reading in the middle of
  one, since it runs user code while it unpickles;
- ``reclaim`` takes back exactly the tasks the worker has not read;
- ``start`` leaves no descriptor open when starting fails;
- ``finish`` kills the worker's process group before reaping, while the unreaped leader
  still pins the group id. It then reaps the worker, reads its crash report and closes
  every descriptor, so nothing accumulates over any number of deaths. It says which
  members of the group are still running, if any;
- ``abandon`` does the same for a process that could not be reaped, keeping only its
  ``Process`` for one last try.
Assumes: under ``fork`` the caller lists every other pool descriptor the child would
inherit (``inherited_fds``), so that only the parent holds the lifeline's write end and the
other workers' task pipes.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from typing import Any, Callable, NamedTuple

from .. import _compat, _platform
from .._wire import frames as _frames, limits as _limits, pipes as _pipes
from .._wire import loans as _loans
from . import progress as _progress, teardown as _teardown
from .._wire.frames import Frame, FrameReader, Kind
from .progress import ItemProgress
from .main import (DUMP_SIGNAL, STOP_SIGNALS, InheritedFd, Initializer, WorkerSetup,
                   worker_main)

# How long a worker whose sentinel fired may take to become reapable: the sentinel can
# report the exit a moment before the kernel lets the process be reaped.
_REAP_SECONDS = 5.0

# How long releasing a dead worker waits for the thread writing it a frame to notice. It
# notices at once, unless another process holds the pipe's read end.
_WRITER_JOIN_SECONDS = 1.0


class Exit(NamedTuple):
    """What is known of a worker once it is gone."""
    pid: int
    exitcode: int | None          # as Process.exitcode; None if it could not be reaped
    crash_report: str | None
    unread_task_bytes: int        # written to its task pipe, never read by it
    group_left: tuple[int, ...] = ()  # processes of its group still running after its reap
    start_error: BaseException | None = None  # what its initializer raised, if it said
    ended_because: str = ""  # why the pool killed a worker whose exit it did not see
    progress: ItemProgress | None = None  # what it recorded of the chunk it ran last


class _LargeFrameWriter:
    """Writes one large frame from a thread, through a descriptor of its own: the
    dispatcher may close its own at any time. It writes in stream mode, since a large frame
    moves faster than as 4 KiB packets. The dispatcher collects it (``done``) before
    writing again, so the pipe is back in packet mode before the next frame."""

    def __init__(self, fd: int, task_id: int, body: _frames.Buffers, frame_bytes: int,
                 packets: bool, on_done: Callable[[], None]) -> None:
        self.task_id = task_id
        body_bytes = frame_bytes - _frames.HEADER.size
        self.unwritten = frame_bytes
        self.failed = False
        self.done = False
        self._fd: int | None = os.dup(fd)
        self._packets = packets
        self._parts = [_frames.HEADER.pack(_frames.MAGIC, Kind.CALL, task_id, body_bytes), *body]
        self._on_done = on_done
        self._thread = threading.Thread(target=self._run, name=f"pool-writer-{task_id}",
                                        daemon=True)
        if packets:
            _pipes.set_packet_mode(self._fd, False)
        self._thread.start()

    @property
    def fds(self) -> list[int]:
        fd = self._fd  # None once the thread is closing it
        return [] if fd is None else [fd]

    def _run(self) -> None:
        parts, fd = self._parts, self._fd
        assert fd is not None
        try:
            _frames.write_all(fd, parts)
        except OSError:
            self.failed = True  # the worker is gone (or closed its end): it never got it all
        finally:
            self.unwritten = sum(map(len, parts))
            self._parts = []
            if self._packets:
                _pipes.set_packet_mode(fd, True)
            self._fd = None
            _teardown.close_fds(fd)
            self.done = True
            self._on_done()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the thread, which ends at once when the worker is gone, unless another
        process holds the pipe's read end. False if it still writes; it is then left to
        end on its own."""
        self._thread.join(timeout)
        return self.done


# The most new descriptors that starting a worker holds at once in the parent: its pipes,
# crash file, progress file, loan desk and first loan (9), and what multiprocessing opens to
# start it. That is a
# socket and two pipes under forkserver, fork_exec's pipes under spawn, with a spare or
# two. They are taken and given back
# before the start, so a start that would run out fails before it begins. A forkserver
# sent half a request, because the parent ran out in the middle, exits on Python
# 3.11-3.13, and every worker it started loses the exit status the pool watches.
_START_DESCRIPTORS = 16


def _check_descriptors_to_start() -> None:
    """Raise ``OSError(EMFILE)`` unless ``_START_DESCRIPTORS`` more can be opened now."""
    taken: list[int] = []
    try:
        for _ in range(_START_DESCRIPTORS):
            taken.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:  # said without the file name, which is only our probe's
        raise OSError(exc.errno, os.strerror(exc.errno or 0)) from None
    finally:
        _teardown.close_fds(*taken)


def _start_holding_stop_signals(process: Any, method: str | None) -> None:
    """``process.start()`` with the stop signals (``STOP_SIGNALS``: SIGINT, SIGTERM,
    SIGHUP) blocked in this thread, so that the process, and under forkserver the server
    that the first start launches, inherits the block.

    A Ctrl-C in a terminal, a SIGTERM from a service manager or a terminal's hang-up
    reaches every process of the program's group. One that landed while a worker or the
    forkserver started, before it ignored SIGINT, killed it (found by the shake: a
    forkserver killed while importing its preloads, and no worker could start). A SIGTERM
    to the group killed the forkserver at any time, and with it the pool's watch over
    every worker it had started. Blocked, such a signal waits: a worker unblocks them once
    it ignores SIGINT (``worker_main``), which drops a pending Ctrl-C and lets a SIGTERM
    end it then; the forkserver never unblocks them, and ends when the parent does. What
    else that forkserver forks (the stdlib's executors, a user's ``Process``) gets them
    back as it starts (``main._give_back_stop_signals``). The parent's own signals are
    unchanged: Python runs handlers in the main thread, whichever thread a signal reaches.

    A forkserver that would start without pool's worker module among its preloads would
    not give them back to those others: then nothing is blocked.
    """
    if method != "fork":
        _compat.start_resource_tracker()   # else it may undo the block (see there)
    if (method == "forkserver" and _compat.forkserver_pid() is None
            and worker_main.__module__ not in _compat.forkserver_preload()):
        process.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _release_failed_start(exc: BaseException) -> None:
    """Gives back what a ``Process.start()`` that raised still holds.

    Under fork: the pipes its ``_launch`` opened, found in that frame, so only those.
    Under every method: the traceback, which keeps the half-made Popen alive, and with it
    the descriptors its finalizer closes (spawn's pipes). The exception itself is kept,
    for the error that may name it later."""
    # fork() itself raised: none of these was closed or handed to anyone.
    _teardown.close_fds(*_compat.pipes_of_failed_fork(exc))
    if exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None


class WorkerHandle:
    def __init__(self, process: Any, task_fd: int, reply_fd: int, crash_fd: int | None,
                 reclaim_fd: int | None, on_write_done: Callable[[], None],
                 no_crash_file: str = "", count_fd: int | None = None,
                 progress_fd: int | None = None,
                 desk: _loans.LoanDesk | None = None) -> None:
        self.process = process
        self.pid: int = process.pid
        self.sentinel: int = process.sentinel
        self.task_fd: int | None = task_fd
        # A read end of the task pipe, in packet mode: frames the worker has not read can be
        # taken back. None where pipes have no packet mode; then nothing waits in the pipe
        # behind the running task.
        self.reclaim_fd = reclaim_fd
        # Where the write end cannot tell how much of the pipe is unread (BSD, macOS:
        # ``_platform.UNREAD_ON_WRITE_END``) and there is no reclaim_fd to ask: the read
        # end the worker was given, kept. Never read: it only answers FIONREAD.
        self.count_fd = count_fd
        self.reader = FrameReader(reply_fd)
        self.crash_fd = crash_fd
        self._no_crash_file = no_crash_file  # why there is no crash_fd, if there is none
        self.progress_fd = progress_fd  # where a chunk records its items (_worker.progress)
        # The segment lent to the worker for its next large result (_wire.loans).
        self.desk = desk
        self._forkserver: int | None = None  # the forkserver that started it, if one did
        self.start_error: BaseException | None = None  # from an INIT_FAILED frame
        self.tasks_run = 0  # replies received: tasks it finished (for stats)
        self.outbox: list[tuple[int, _frames.Buffers]] = []  # CALL frames queued this turn
        self._outbox_bytes = 0  # their size, headers included
        # Why the state machine called this worker misbehaving; nothing more is read from
        # it then. None while it keeps to the protocol.
        self.misbehaved: str | None = None
        self.room = _pipes.PipeRoom(task_fd)
        # _wire.limits, rule 3: no larger than this pipe, if it is a small one.
        self._background_above = _limits.background_above(_pipes.pipe_capacity(task_fd))
        self.writer: _LargeFrameWriter | None = None  # writing a large frame, in a thread
        self._on_write_done = on_write_done

    @classmethod
    def start(cls, ctx: Any, name: str, *, lifeline_fd: int, initializer: Initializer | None,
              max_tasks: int | None, max_memory: int | None,
              inherited_fds: tuple[int, ...] | None,
              on_write_done: Callable[[], None]) -> WorkerHandle:
        """Start a worker process. ``inherited_fds`` is None unless the context forks.
        ``on_write_done`` is called (from another thread) when a large frame is written."""
        opened: list[int] = []  # closed again if the start fails midway (EMFILE, EAGAIN)
        method = getattr(ctx, "get_start_method", lambda: None)()
        try:
            _check_descriptors_to_start()
            task_r, task_w = os.pipe()
            opened += (task_r, task_w)
            reclaim_fd = None
            if (_pipes.pipe_capacity(task_w) or 0) >= _limits.PACKET_PIPE_BYTES:
                reclaim_fd = _pipes.second_reader(task_r)
                if reclaim_fd is not None and not _pipes.set_packet_mode(task_w, True):
                    _teardown.close_fds(reclaim_fd)
                    reclaim_fd = None
                if reclaim_fd is not None:
                    opened.append(reclaim_fd)
            reply_r, reply_w = os.pipe()
            opened += (reply_r, reply_w)
            crash_fd, no_crash_file = _teardown.make_crash_file()
            if crash_fd is not None:
                opened.append(crash_fd)
            progress_fd, _, progress_in_memory = _teardown.make_private_file(
                "pool-progress", "pool-progress-")
            if progress_fd is not None:
                opened.append(progress_fd)
            desk = None
            if _platform.SHARED_MEMORY:
                try:
                    desk = _loans.LoanDesk()
                except OSError:
                    pass  # its large results go through the pipe
                else:
                    opened.append(desk.fd)
            # The worker's own read end, kept to count what it leaves unread (see count_fd).
            count_fd = (task_r if reclaim_fd is None and not _platform.UNREAD_ON_WRITE_END
                        else None)
            to_close = () if inherited_fds is None else (
                task_w, reply_r, *([] if reclaim_fd is None else [reclaim_fd]), *inherited_fds)
            setup = WorkerSetup(task_fd=InheritedFd(task_r), reply_fd=InheritedFd(reply_w),
                                lifeline_fd=InheritedFd(lifeline_fd),
                                crash_fd=None if crash_fd is None else InheritedFd(crash_fd),
                                initializer=initializer,
                                max_tasks=max_tasks, max_memory=max_memory,
                                fds_to_close=to_close, forked=inherited_fds is not None,
                                portable=_platform.PORTABLE,
                                progress_fd=(None if progress_fd is None
                                             else InheritedFd(progress_fd)),
                                progress_in_memory=progress_in_memory,
                                desk=None if desk is None else (os.getpid(), desk.fd))
            process = ctx.Process(target=worker_main, args=(setup,), name=name)
            with _compat.std_streams_left_unflushed():  # a blocked stdout must not block us
                _start_holding_stop_signals(process, method)
        except BaseException as exc:
            _teardown.close_fds(*opened)
            _release_failed_start(exc)
            raise
        # The child's ends (it has its own copies), but a task_r kept as count_fd.
        _teardown.close_fds(None if count_fd is not None else task_r, reply_w)
        os.set_blocking(reply_r, False)
        handle = cls(process, task_w, reply_r, crash_fd, reclaim_fd, on_write_done,
                     no_crash_file, count_fd, progress_fd, desk)
        if desk is not None:
            desk.lend()
        if method == "forkserver":
            handle._forkserver = _compat.forkserver_pid()
        return handle

    def parent_fds(self) -> list[int]:
        fds = [self.reader.fd, self.sentinel]
        fds += [fd for fd in (self.crash_fd, self.progress_fd) if fd is not None]
        if self.desk is not None:
            fds += self.desk.fds()
        return fds + self.task_pipe_fds()

    def task_pipe_fds(self) -> list[int]:
        """The parent's descriptors of the task pipe. A forked child must close them all,
        or the worker would not see end of file when asked to stop."""
        fds = [fd for fd in (self.task_fd, self.reclaim_fd, self.count_fd) if fd is not None]
        return fds + (self.writer.fds if self.writer is not None else [])

    def send(self, task_id: int, body: _frames.Buffers, frame_bytes: int) -> None:
        """Queue one CALL frame (``frame_bytes`` long, header included); ``flush`` writes
        what was queued."""
        assert self.task_fd is not None, "sending to a worker asked to stop"
        self.outbox.append((task_id, body))
        self._outbox_bytes += frame_bytes

    def flush(self) -> list[int]:
        """Writes the queued frames. Returns the ids of those that could not be written
        because the worker is gone: it never got them. A large frame is handed to a thread
        (see ``collect_writer``); while one is being written, frames wait here."""
        if not self.outbox or self.writer is not None:
            return []
        frames, self.outbox = self.outbox, []
        size, self._outbox_bytes = self._outbox_bytes, 0
        assert self.task_fd is not None
        self.room.fit(size)
        if size > self._background_above:
            # Sent only to a worker with nothing else in flight, so it is alone.
            assert len(frames) == 1, "a large frame with others behind it"
            self.writer = _LargeFrameWriter(self.task_fd, *frames[0], size,
                                            self.reclaim_fd is not None,
                                            self._on_write_done)
            return []
        if self.reclaim_fd is None:
            written = _frames.write_frames(self.task_fd, Kind.CALL, frames)
        else:  # one write per frame: one packet each
            written = 0
            for frame in frames:
                if _frames.write_frames(self.task_fd, Kind.CALL, [frame]) == 0:
                    break
                written += 1
        return [task_id for task_id, _ in frames[written:]]

    def collect_writer(self) -> int | None:
        """Lets go of a thread that has finished writing a large frame. Returns the task's
        id if the frame could not be written whole, because the worker is gone and never
        got it; else None."""
        writer = self.writer
        if writer is None or not writer.done:
            return None
        writer.join()
        self.writer = None
        return writer.task_id if writer.failed else None

    def reclaim(self) -> list[int]:
        """Take back the tasks the worker has not read, with those not yet written; their
        ids in the order they were sent."""
        taken = []
        if self.reclaim_fd is not None and self.writer is None:
            taken = [task_id for _, task_id in _pipes.read_packets(self.reclaim_fd)]
        taken += [task_id for task_id, _ in self.outbox]
        self.outbox, self._outbox_bytes = [], 0
        return taken

    def read(self) -> list[Frame]:
        """The frames that have arrived; see ``reader.eof`` and ``reader.error`` after."""
        if self.reader.eof or self.reader.error:
            return []
        return self.reader.read_available()

    @property
    def watch_replies(self) -> bool:
        # At end of file the pipe would be readable forever: stop watching it.
        return not (self.reader.eof or self.reader.error or self.misbehaved)

    def close_task_pipe(self) -> None:
        """Ask the worker to stop: it exits when it reads end of file."""
        assert not self.outbox, "closing a task pipe with frames not yet written"
        for fd in (self.task_fd, self.reclaim_fd, self.count_fd):
            if fd is not None:
                _teardown.close_fds(fd)
        self.task_fd = self.reclaim_fd = self.count_fd = None

    def signal(self, signum: int) -> None:
        _teardown.signal_worker(self.pid, signum)

    def dump_stack(self) -> None:
        """Ask the worker alone (not its group) to write its stack and exit."""
        try:
            os.kill(self.pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass  # already gone: its sentinel will say so

    def finish(self, reap_timeout: float = _REAP_SECONDS, *, sentinel_fired: bool = True
               ) -> Exit:
        """After its sentinel fired, or with ``sentinel_fired=False`` to end it at once:
        ends its group, reaps it and releases it."""
        # Under forkserver the sentinel is a pipe from the forkserver, which writes the
        # exit status into it once it has reaped the worker. If the forkserver exits first,
        # as on Python 3.11-3.13 when the system refuses it a fork, the pipe closes while
        # the worker still runs. A worker still there when its sentinel fired can only
        # mean that. This does not also check that the forkserver is gone: the kernel
        # closes a dying process's pipes before /proc shows it exited, and that check lost
        # the race.
        status_lost = (sentinel_fired and self._forkserver is not None
                       and _teardown.still_running(self.pid))
        self.signal(signal.SIGKILL)
        exitcode = _teardown.reap(self.process, timeout=reap_timeout)
        left = tuple(_teardown.live_group_members(self.pid)) if exitcode is not None else ()
        if status_lost:
            return self._release(-signal.SIGKILL, left, ended_because=(
                "The worker was still running when what reports its exit closed: the "
                "forkserver that started it had exited (it exits when the system refuses "
                "it a process). The pool could no longer watch the worker, so it killed it."))
        return self._release(exitcode, left)

    def abandon(self) -> Exit:
        """Gives up on a process that outlived SIGKILL's grace. Releases its descriptors
        but its sentinel, and keeps its ``Process`` so that ``reap_abandoned`` can try
        again."""
        return self._release(None, ())

    def reap_abandoned(self, timeout: float) -> bool:
        """One more try at reaping an abandoned worker; True if it is gone now. If not, the
        pool lets go of it for good (see ``teardown.forget_process``)."""
        if _teardown.reap(self.process, timeout=timeout) is not None:
            return True
        _teardown.forget_process(self.process)
        self.process = None
        return False

    def _unread_task_bytes(self) -> int:
        """What was written to the task pipe and not read; 0 once the pipe is closed."""
        if self.task_fd is None:
            return 0
        if _platform.UNREAD_ON_WRITE_END:
            return _pipes.unread_bytes(self.task_fd)
        # A read end answers everywhere: the reclaim end, or the one kept to count.
        read_end = self.reclaim_fd if self.reclaim_fd is not None else self.count_fd
        return 0 if read_end is None else _pipes.unread_bytes(read_end)

    def _release(self, exitcode: int | None, group_left: tuple[int, ...],
                 ended_because: str = "") -> Exit:
        unread = self._unread_task_bytes()
        if self.writer is not None:
            # With our read ends closed too, no reader is left: the thread sees EPIPE.
            _teardown.close_fds(self.reclaim_fd, self.count_fd)
            self.reclaim_fd = self.count_fd = None
            writer, self.writer = self.writer, None
            unread += writer.unwritten if writer.join(_WRITER_JOIN_SECONDS) else 1
        # Frames still queued were never written: as good as unread (they come last).
        unread += self._outbox_bytes
        self.outbox, self._outbox_bytes = [], 0
        crash_report = (_teardown.read_crash_report(self.crash_fd) if self.crash_fd is not None
                        else f"none: {self._no_crash_file}")
        # Read whatever the exit: even os._exit(0) in the middle of a chunk fails it.
        progress = _progress.read(self.progress_fd)
        self.close_task_pipe()
        _teardown.close_fds(self.reader.fd, self.crash_fd, self.progress_fd)
        if self.desk is not None:  # a worker not reaped may still map its loan
            self.desk.close(worker_gone=exitcode is not None)
            self.desk = None
        return Exit(self.pid, exitcode, crash_report, unread, group_left, self.start_error,
                    ended_because, progress)

"""The parent's handle on one worker process: start it, talk to it, end it.

Owns: for one worker, its ``Process`` object and the parent's ends of its four
descriptors: task pipe (write), reply pipe (read, non-blocking), crash-report file, and
the process sentinel.
Runs in: the dispatcher thread only.
Guarantees: ``start`` leaves no descriptor open when starting fails; ``finish`` kills the
worker's process group before reaping (while the unreaped leader still pins the group id),
reaps it, reads its crash report, closes every descriptor (so nothing accumulates over any
number of deaths) and says which members of its group are still running, if any;
``abandon`` does the same for a process that could not be reaped, keeping only its
``Process`` for one last try.
Assumes: under ``fork`` the caller lists every other pool descriptor the child would
inherit (``inherited_fds``), so that only the parent holds the lifeline's write end and the
other workers' task pipes.
"""

from __future__ import annotations

import os
import signal
from typing import Any, NamedTuple

from . import _teardown, _wire
from ._wire import Frame, FrameReader, Kind
from ._worker import DUMP_SIGNAL, InheritedFd, WorkerSetup, worker_main

# How long a worker whose sentinel fired may take to become reapable: the sentinel can
# report the exit a moment before the kernel lets the process be reaped.
_REAP_SECONDS = 5.0


class Exit(NamedTuple):
    """What is known of a worker once it is gone."""
    pid: int
    exitcode: int | None          # as Process.exitcode; None if it could not be reaped
    crash_report: str | None
    unread_task_bytes: int        # written to its task pipe, never read by it
    group_left: tuple[int, ...] = ()  # processes of its group still running after its reap


class WorkerHandle:
    def __init__(self, process: Any, task_fd: int, reply_fd: int, crash_fd: int) -> None:
        self.process = process
        self.pid: int = process.pid
        self.sentinel: int = process.sentinel
        self.task_fd: int | None = task_fd
        self.reader = FrameReader(reply_fd)
        self.crash_fd = crash_fd
        self.start_error: BaseException | None = None  # from an INIT_FAILED frame
        self.outbox: list[tuple[int, bytes]] = []      # CALL frames queued this turn

    @classmethod
    def start(cls, ctx: Any, name: str, *, lifeline_fd: int, initializer: bytes | None,
              max_tasks: int | None, max_memory: int | None,
              inherited_fds: tuple[int, ...] | None) -> WorkerHandle:
        """Start a worker process. ``inherited_fds`` is None unless the context forks."""
        task_r, task_w = os.pipe()
        reply_r, reply_w = os.pipe()
        crash_fd = _teardown.make_crash_file()
        to_close = () if inherited_fds is None else (task_w, reply_r, *inherited_fds)
        setup = WorkerSetup(task_fd=InheritedFd(task_r), reply_fd=InheritedFd(reply_w),
                            lifeline_fd=InheritedFd(lifeline_fd), crash_fd=InheritedFd(crash_fd),
                            initializer=initializer, max_tasks=max_tasks,
                            max_memory=max_memory, fds_to_close=to_close)
        process = ctx.Process(target=worker_main, args=(setup,), name=name)
        try:
            process.start()
        except BaseException:
            _teardown.close_fds(task_w, reply_r, crash_fd)
            raise
        finally:
            _teardown.close_fds(task_r, reply_w)  # the child's ends (it has its own copies)
        os.set_blocking(reply_r, False)
        return cls(process, task_w, reply_r, crash_fd)

    def parent_fds(self) -> list[int]:
        fds = [self.reader.fd, self.crash_fd, self.sentinel]
        return fds + ([self.task_fd] if self.task_fd is not None else [])

    def send(self, task_id: int, body: bytes) -> None:
        """Queue one CALL frame; ``flush`` writes what was queued."""
        assert self.task_fd is not None, "sending to a worker asked to stop"
        self.outbox.append((task_id, body))

    def flush(self) -> list[int]:
        """Write the queued frames in one go; returns the ids of those that could not be
        written because the worker is gone (it never got them)."""
        frames, self.outbox = self.outbox, []
        if not frames:
            return []
        assert self.task_fd is not None
        written = _wire.write_frames(self.task_fd, Kind.CALL, frames)
        return [task_id for task_id, _ in frames[written:]]

    def read(self) -> list[Frame]:
        """The frames that have arrived; see ``reader.eof`` and ``reader.error`` after."""
        if self.reader.eof or self.reader.error:
            return []
        return self.reader.read_available()

    @property
    def watch_replies(self) -> bool:
        # At end of file the pipe would be readable forever: stop watching it.
        return not (self.reader.eof or self.reader.error)

    def close_task_pipe(self) -> None:
        """Ask the worker to stop: it exits when it reads end of file."""
        assert not self.outbox, "closing a task pipe with frames not yet written"
        if self.task_fd is not None:
            _teardown.close_fds(self.task_fd)
            self.task_fd = None

    def signal(self, signum: int) -> None:
        _teardown.signal_worker(self.pid, signum)

    def dump_stack(self) -> None:
        """Ask the worker alone (not its group) to write its stack and exit."""
        try:
            os.kill(self.pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass  # already gone: its sentinel will say so

    def finish(self, reap_timeout: float = _REAP_SECONDS) -> Exit:
        """After its sentinel fired (or after a SIGKILL): end its group, reap, release."""
        self.signal(signal.SIGKILL)
        exitcode = _teardown.reap(self.process, timeout=reap_timeout)
        left = tuple(_teardown.live_group_members(self.pid)) if exitcode is not None else ()
        return self._release(exitcode, left)

    def abandon(self) -> Exit:
        """Give up on a process that outlived SIGKILL's grace: release its descriptors but
        its sentinel, and keep its ``Process`` so that ``reap_abandoned`` can try again."""
        return self._release(None, ())

    def reap_abandoned(self, timeout: float) -> bool:
        """One more try at reaping an abandoned worker; True if it is gone now. If not, the
        pool lets go of it for good (see ``_teardown.forget_process``)."""
        if _teardown.reap(self.process, timeout=timeout) is not None:
            return True
        _teardown.forget_process(self.process)
        self.process = None
        return False

    def _release(self, exitcode: int | None, group_left: tuple[int, ...]) -> Exit:
        unread = _teardown.unread_bytes(self.task_fd) if self.task_fd is not None else 0
        # Frames still queued were never written: as good as unread (they come last).
        unread += sum(_wire.HEADER.size + len(body) for _, body in self.outbox)
        self.outbox = []
        crash_report = _teardown.read_crash_report(self.crash_fd)
        self.close_task_pipe()
        _teardown.close_fds(self.reader.fd, self.crash_fd)
        return Exit(self.pid, exitcode, crash_report, unread, group_left)

"""Ending worker processes, and reading what a dead one left behind.

Owns: nothing. These are functions the dispatcher calls, through ``WorkerHandle``, on the
processes it owns: signalling a worker and its group, reaping, closing descriptors, and
the crash-report file. How much of a task pipe was never read is
``_wire.pipes.unread_bytes``.
Runs in: the dispatcher thread, and its firewall when the pool is failing.
Guarantees: signals go to the worker and to its whole process group, so the processes a
task started end with it. A process group is signalled only while its leader is unreaped:
a zombie still holds its pid, so an id the kernel recycled is never hit.
Assumes: each worker leads its own process group (``_worker.main`` makes it so).
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

from .. import _compat, _platform

_CRASH_REPORT_LIMIT = 64 * 1024


def signal_worker(pid: int, signum: int) -> None:
    """Send ``signum`` to a worker and to its process group. Its pid must be unreaped."""
    for send in (os.kill, os.killpg):
        try:
            send(pid, signum)
        except ProcessLookupError:
            pass  # already gone, or its group was never made / is empty
        except PermissionError:
            pass  # a setuid program in the group; the worker itself is still signalled


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, pgrp...);
    None if there is no such process (or no /proc)."""
    if not _platform.PROC:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def still_running(pid: int) -> bool:
    """Whether the process exists and is not a zombie, from /proc (Linux). Where there is
    no /proc (``_platform.PROC``), whether it exists at all: a zombie counts."""
    if not _platform.PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # it exists, as another user's process
        return True
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def live_group_members(pgid: int) -> list[int]:
    """Processes still running in process group ``pgid`` (zombies do not count).

    Cheap when the group is empty, the usual case: one ``killpg(pgid, 0)``. Otherwise the
    members are found in /proc (Linux); elsewhere (``_platform.PROC``) the group is only
    known to be non-empty and ``[pgid]`` stands for it. Call it after the group's leader
    was reaped: while any member is left, the kernel keeps the id from being reused.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # a member we may not signal: still a member
    if not _platform.PROC:
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def read_crash_report(fd: int | None) -> str | None:
    """What the worker's faulthandler wrote into its crash-report file, if anything."""
    if fd is None:
        return None
    try:
        data = os.pread(fd, _CRASH_REPORT_LIMIT + 1, 0)
    except OSError:
        return None
    text = data[:_CRASH_REPORT_LIMIT].decode("utf-8", "replace").strip()
    if len(data) > _CRASH_REPORT_LIMIT:
        text += "\n[crash report truncated]"
    return _crashing_thread_first(text) or None


def _crashing_thread_first(text: str) -> str:
    """Put the thread that crashed right after the error line; drop the pool's watchdog.

    faulthandler writes one block per thread, separated by blank lines, in thread order.
    The reader wants the crash site first, and the watchdog's stack is never of interest.
    """
    blocks = text.split("\n\n")
    threads = [b for b in blocks if b.startswith(("Thread 0x", "Current thread 0x"))]
    others = [b for b in blocks if b not in threads]
    threads = [_without_pool_frames(b) for b in threads if "in _watch_parent" not in b]
    threads.sort(key=lambda b: not b.startswith("Current thread"))
    return "\n\n".join(others[:1] + threads + others[1:])


def _without_pool_frames(block: str) -> str:
    # Most recent call first: everything from the worker's own loop down is the pool's
    # machinery (and multiprocessing's bootstrap), the same in every report.
    lines = _saying_where_no_frame_shows(block.splitlines())
    for number, line in enumerate(lines):
        if line.strip().startswith("File ") and _WORKER_FILE in line:
            return "\n".join(lines[:number])
    return "\n".join(lines)


def _saying_where_no_frame_shows(lines: list[str]) -> list[str]:
    """A thread whose latest frame is the pool's own call of the task's function (or of
    the function a chunk maps) was inside that function, and it has no Python frame: a
    built-in such as ``time.sleep`` called directly. The stack would say nothing of it
    once the pool's frames are gone; a line in their place says where it was."""
    from .._errors import IN_THE_MAPPED_FUNCTION, IN_THE_TASK_FUNCTION
    if len(lines) < 2 or not lines[1].strip().startswith("File "):
        return lines
    for filename, function, says in ((_WORKER_FILE, "_outcome", IN_THE_TASK_FUNCTION),
                                     (_WORKER_FILE, "process_items", IN_THE_MAPPED_FUNCTION),
                                     (_WORKER_FILE, "process_chunk", IN_THE_MAPPED_FUNCTION),
                                     (_COMMAND_TASK_FILE, "_run_one", IN_THE_MAPPED_FUNCTION)):
        if f'"{filename}"' in lines[1] and lines[1].endswith(f" in {function}"):
            return [lines[0], says, *lines[1:]]
    return lines


# The worker's main module, ``main.py`` beside this one: its frames end a crash report.
_WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main.py")
# The command line's task module, which calls the user's function on each input.
_COMMAND_TASK_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  "_cli", "task.py")


def make_crash_file() -> tuple[int | None, str]:
    """The worker's crash-report file (see ``make_private_file``)."""
    fd, why, _ = make_private_file("pool-crash-report", "pool-crash-")
    return fd, why


def make_private_file(name: str, prefix: str) -> tuple[int | None, str, bool]:
    """An anonymous file shared by the parent and one worker (its crash report, its
    progress file), private to the pool's processes: nothing is left on disk however we
    die. A ``memfd`` where the system has them (``_platform.MEMFD``): no directory is
    involved, so a full or read-only temp directory does not matter. Else a temp file,
    mode 0600, unlinked at once.

    Returns ``(fd, "", in_memory)`` (``in_memory``: a memfd), or ``(None, why, False)``
    when no file can be made. The worker then runs without one: its death is explained
    without its stack, or a chunk it was running fails whole. Running out of descriptors
    raises instead: then no worker can start at all, and the dispatcher retries later."""
    if _platform.MEMFD:
        try:
            return os.memfd_create(name), "", True
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise
            # ENOSYS on an old kernel, EPERM under a seccomp filter: a temp file instead.
    try:
        fd, path = tempfile.mkstemp(prefix=prefix)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return None, (f"the pool could not create a file for it in {tempfile.gettempdir()} "
                      f"({type(exc).__name__}: {exc})"), False
    os.unlink(path)
    return fd, "", False


def close_fds(*fds: int | None) -> None:
    for fd in fds:
        if fd is None:
            continue
        try:
            os.close(fd)
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise


def forget_process(process: Any) -> None:
    """Let go of a process that could not be reaped (after reporting it by pid).

    multiprocessing remembers every child it started and joins them all at interpreter
    exit: a process stuck for good would hang that exit. Dropped from that set and from
    our references, its ``Process`` is collected and its descriptors closed.
    """
    _compat.forget_child_process(process)


def reap(process: Any, timeout: float = 0.0) -> int | None:
    """Join the process (reaping it) and release its descriptors; its exit code, or None.

    The ``Process`` itself is not ``close()``d. Code that took it from
    ``executor._processes`` may still ``join()`` it, read ``exitcode`` or ``is_alive()``, or
    call ``terminate()``, now a no-op, as with the stdlib. Only its popen is closed. That
    closes the sentinel's descriptors now rather than whenever the object is collected;
    from then on the ``Process`` answers from the exit status it keeps.
    """
    process.join(timeout)
    exitcode: int | None = process.exitcode
    if exitcode is not None:
        _compat.close_process_popen(process)
    return exitcode

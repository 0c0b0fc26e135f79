"""What this platform offers pool beyond POSIX, and the switch to pretend it offers only
POSIX.

Owns: one flag per mechanism pool uses where the system has it, and ``PORTABLE``, the
switch that turns them all off. Every site that uses such a mechanism asks its flag here,
and nothing else decides: not the site, not a test.
Runs in: every process of a pool. The parent reads the switch once, at import, from the
environment variable ``POOL_PORTABLE`` (set and not ``0``: on), so no hot path looks at
the environment. A worker then takes its parent's choice (``adopt``), whatever its own
environment said: the forkserver may have read another one when it started.
Guarantees: with ``POOL_PORTABLE=1`` every flag is False, so on Linux pool takes the very
path a macOS or BSD user takes, and the test suite can run it. Without the switch, a flag
is True only where the mechanism is there.
Assumes: a flag is read where it is used, as ``_platform.FLAG``, never copied into another
module's constant: ``adopt`` may change it in a worker.

The mechanisms, who uses them, and what runs without them:

``PACKET_PIPES`` (Linux 3.4+): ``O_DIRECT`` on a task pipe (``_wire.pipes``), so that each
    small frame is one packet. With ``PROC`` and ``PIPE_RESIZE`` it lets the parent queue
    up to ``_wire.limits.PIPELINE_DEPTH`` small tasks in a worker's pipe and take back those
    not read. Without: one task in flight per worker (a round trip between tasks), and
    nothing to take back.
``PIPE_RESIZE`` (Linux): ``F_GETPIPE_SZ``/``F_SETPIPE_SZ`` (``_wire.pipes``). The capacity
    is known, so packets are queued only in a pipe that holds them all, and a pipe grows
    to 1 MiB while large frames go through it. Without: the capacity is taken to be the
    POSIX 64 KiB for the size above which a frame gets a writer thread; pipes keep their
    size; no packets are queued.
``PROC`` (Linux ``/proc``): a second, non-blocking read end of a task pipe through
    ``/proc/self/fd`` (``_wire.pipes.second_reader``, needed for packets); whether a
    forkserver's worker still runs and which processes are left in a worker's group
    (``/proc/PID/stat``, ``_worker.teardown``); a worker's resident memory for
    ``max_memory_per_child`` (``/proc/self/statm``, ``_worker.main``) and for ``stats()``
    (``/proc/PID/statm``, ``_stats``). Without: no second reader (so no packets);
    ``os.kill(pid, 0)`` says whether a process exists (a zombie counts); a group not
    empty is reported by its id alone; ``max_memory_per_child`` compares the worker's
    peak resident memory (``getrusage``) instead, which retires a worker at least
    whenever the current size would; ``WorkerStats.rss`` is None.
``UNREAD_ON_WRITE_END`` (Linux): ``FIONREAD`` answers on a pipe's write end, so the
    parent's task pipe end says how much a dead worker left unread, and so which tasks it
    never began. Without (BSD and macOS answer 0 there): the parent keeps a read end of
    each task pipe and asks that one.
``MEMFD`` (Linux, FreeBSD 13+): ``memfd_create`` for a worker's crash-report file
    (``_worker.teardown``). Without: a temp file, mode 0600, unlinked at once.
``SHARED_MEMORY`` (Linux): large payloads of a call or a result travel through shared
    memory (``_wire.segments`` and its siblings): ``memfd_create``, and ``/proc/PID/fd``
    to open another process's segment. Without: through the pipe, as every other byte.
``CPU_AFFINITY`` (Linux): ``sched_getaffinity`` for the default worker count on Python
    3.11-3.12 (``_options``; 3.13+ asks ``os.process_cpu_count``). Without:
    ``os.cpu_count()``.
``POLL_READER_GONE`` (Linux): a pipe's write end polls as an error once its reader has
    gone, so ``python -m pool map ... | head`` ends at once (``_cli.lines``). Without: at
    the next line written.
"""

from __future__ import annotations

import os
import sys

try:
    import fcntl
except ImportError:  # not POSIX: pool does not run there, but importing must not fail
    fcntl = None  # type: ignore[assignment]

# The switch: on when set to anything but "" or "0". Read once, here.
PORTABLE: bool = os.environ.get("POOL_PORTABLE", "") not in ("", "0")

PACKET_PIPES: bool
PIPE_RESIZE: bool
PROC: bool
UNREAD_ON_WRITE_END: bool
MEMFD: bool
SHARED_MEMORY: bool
CPU_AFFINITY: bool
POLL_READER_GONE: bool


def _offered(portable: bool) -> dict[str, bool]:
    """The flags for a process that does (or does not) pretend to be only POSIX."""
    linux = sys.platform.startswith("linux") and not portable
    resize = linux and all(hasattr(fcntl, name) for name in ("F_SETPIPE_SZ", "F_GETPIPE_SZ"))
    return {
        "PACKET_PIPES": resize and hasattr(os, "O_DIRECT"),
        "PIPE_RESIZE": resize,
        "PROC": linux and os.path.isdir("/proc/self/fd"),
        "UNREAD_ON_WRITE_END": linux,
        "MEMFD": not portable and hasattr(os, "memfd_create"),
        "SHARED_MEMORY": (linux and hasattr(os, "memfd_create")
                          and os.path.isdir("/proc/self/fd")),
        "CPU_AFFINITY": linux and hasattr(os, "sched_getaffinity"),
        "POLL_READER_GONE": linux,
    }


def adopt(portable: bool) -> None:
    """Take the parent's choice (in a worker, as it starts)."""
    global PORTABLE, PACKET_PIPES, PIPE_RESIZE, PROC, UNREAD_ON_WRITE_END, MEMFD
    global CPU_AFFINITY, POLL_READER_GONE, SHARED_MEMORY
    flags = _offered(portable)
    PORTABLE = portable
    PACKET_PIPES, PIPE_RESIZE = flags["PACKET_PIPES"], flags["PIPE_RESIZE"]
    PROC, UNREAD_ON_WRITE_END = flags["PROC"], flags["UNREAD_ON_WRITE_END"]
    MEMFD, CPU_AFFINITY = flags["MEMFD"], flags["CPU_AFFINITY"]
    SHARED_MEMORY = flags["SHARED_MEMORY"]
    POLL_READER_GONE = flags["POLL_READER_GONE"]


adopt(PORTABLE)
assert not PORTABLE or not any(_offered(True).values())

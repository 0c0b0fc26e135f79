"""A forked worker's standard streams: what it inherited unwritten is dropped, and a
stream it inherited with its lock taken is replaced.

Runs in: a worker process started by ``fork``, first thing in ``worker_main``. The process
then has no thread but its main one and those this module starts.
Guarantees: the worker does not print the parent's unwritten text again. No stream in
``sys`` is one whose lock a thread of the parent held at the fork. Otherwise the stream
objects stay as they are: a logging handler may hold one, ``-u`` makes them unbuffered,
the user may have wrapped them.
Assumes: a forked worker ends by ``os._exit``, as multiprocessing's fork ``Popen`` does. So
nothing finalizes, and so flushes, a stream left alone here.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from typing import Any

# How long flushing a stream into /dev/null may take before its lock counts as held by a
# thread of the parent (it takes microseconds otherwise).
STUCK_FLUSH_SECONDS = 0.5
_abandoned: list[Any] = []   # kept, so that nothing ever finalizes them


def drop_inherited_output() -> None:
    """Throws away the text the standard streams inherited unwritten.

    The pool forks from its dispatcher thread and skips multiprocessing's flush before it
    (see ``handle``). So what the parent's threads printed and had not written yet is
    still in the buffers the child inherited. The child would print it again when it
    exits: seen as duplicated lines of ``python -m pool demo --start-method fork``. That
    text is the parent's, which prints it itself. So each stream is flushed into
    ``/dev/null``: its descriptor points there for that moment.

    But a buffered stream that a thread of the parent was writing to at the fork has its
    lock taken, by a thread this process does not have. Flushing it would never return,
    nor would the flush multiprocessing makes as the worker exits. Or, when the new thread
    happens to get the old one's id (glibc reuses its stack), the flush raises "reentrant
    call". So each flush runs in a thread of its own. A stream whose flush has neither
    returned nor failed on its descriptor after ``STUCK_FLUSH_SECONDS`` is replaced in
    ``sys`` by a new one on its descriptor, and left alone for good.
    """
    streams = {id(stream): stream for stream in (sys.stdout, sys.stderr, sys.__stdout__,
                                                 sys.__stderr__) if stream is not None}
    fd_of: dict[int, int] = {}
    for key, stream in streams.items():
        try:
            fd_of[key] = stream.fileno()
        except (AttributeError, ValueError, OSError):
            pass  # not on a descriptor (replaced, or closed): nothing of the parent's to drop
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    saved: dict[int, tuple[int, bool]] = {}
    try:
        for fd in set(fd_of.values()):
            try:
                saved[fd] = (os.dup(fd), os.get_inheritable(fd))
                os.dup2(devnull, fd)
            except OSError:
                continue
        stuck = _flush_each(list(streams.values()))
    finally:
        for fd, (copy, inheritable) in saved.items():
            os.dup2(copy, fd, inheritable=inheritable)
            os.close(copy)
        os.close(devnull)
    for stream in stuck:
        _replace(stream, fd_of.get(id(stream)))


def _flush_each(streams: list[Any]) -> list[Any]:
    """Flushes each stream in a thread of its own. Returns those whose flush did not end,
    or ended in an error other than the descriptor's own."""
    flushed: set[int] = set()

    def flush(stream: Any) -> None:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass   # the descriptor's own error: the stream itself is usable
        except BaseException:
            return   # "reentrant call inside ...": its lock was taken at the fork
        flushed.add(id(stream))

    threads = []
    for stream in streams:
        thread = threading.Thread(target=flush, args=(stream,), daemon=True,
                                  name="pool-worker-flush")
        try:
            thread.start()
        except RuntimeError:   # no thread to be had: flush here, and hope
            flush(stream)
            continue
        threads.append(thread)
    deadline = time.monotonic() + STUCK_FLUSH_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [stream for stream in streams if id(stream) not in flushed]


def _replace(stuck: Any, fd: int | None) -> None:
    _abandoned.append(stuck)
    if fd is None:
        return
    try:
        fresh = io.TextIOWrapper(
            io.open(fd, "wb", closefd=False), encoding=getattr(stuck, "encoding", None),
            errors=getattr(stuck, "errors", None),
            line_buffering=getattr(stuck, "line_buffering", False),
            write_through=getattr(stuck, "write_through", False))
    except (OSError, ValueError, LookupError):
        return
    for name in ("stdout", "stderr", "__stdout__", "__stderr__"):
        if getattr(sys, name, None) is stuck:
            setattr(sys, name, fresh)

"""A forked worker's inherited standard streams (``pool._worker.streams``): which count as
stuck, and what replaces them. (The whole story, with real forks: test_blocked_output.)"""

from __future__ import annotations

import io
import os
import sys
import threading

from pool._worker import streams as _worker_streams


class Stream:
    def __init__(self, flush: object) -> None:
        self._flush = flush

    def flush(self) -> None:
        self._flush()  # type: ignore[operator]


def test_a_flush_that_hangs_or_finds_its_lock_taken_counts_as_stuck(monkeypatch):
    monkeypatch.setattr(_worker_streams, "STUCK_FLUSH_SECONDS", 0.2)
    release = threading.Event()

    def reentrant() -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")

    def closed_descriptor() -> None:
        raise OSError(9, "Bad file descriptor")

    streams = [Stream(lambda: None), Stream(release.wait), Stream(reentrant),
               Stream(closed_descriptor)]
    try:
        stuck = _worker_streams._flush_each(streams)
    finally:
        release.set()
    assert stuck == [streams[1], streams[2]]


def test_a_stuck_stream_is_replaced_in_sys_by_one_on_its_descriptor(monkeypatch):
    read_end, write_end = os.pipe()
    stuck = io.TextIOWrapper(io.open(write_end, "wb", closefd=False), encoding="latin-1",
                             line_buffering=True)
    monkeypatch.setattr(sys, "stdout", stuck)
    try:
        _worker_streams._replace(stuck, write_end)
        fresh = sys.stdout
        assert fresh is not stuck and _worker_streams._abandoned[-1] is stuck
        assert (fresh.encoding, fresh.line_buffering, fresh.fileno()) == (
            "latin-1", True, write_end)
        print("through the new stream")
        assert os.read(read_end, 100) == b"through the new stream\n"
    finally:
        _worker_streams._abandoned.remove(stuck)
        os.close(read_end)
        os.close(write_end)

"""A hostile wire, property-based (hypothesis): arbitrary bytes, truncated frames, length
headers that claim more than there is, and frames for tasks never sent.

First the parent's ``FrameReader`` alone, over a real pipe (thousands of cases): it parses
what is well formed, reports what is not, never raises, never blocks, and never allocates
what a header merely claims. Then the dispatcher, fed by a fake worker (a task that writes
such bytes into its own reply pipe): the task ends, as a reply, a ``WorkerProtocolError``
or a timeout, and nothing else in the pool notices.
"""

from __future__ import annotations

import fcntl
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pool
import tasks
from pool._wire import frames as _frames
from pool._wire.frames import HEADER, MAGIC, FrameReader, Kind

FROM_WORKER = [k for k in Kind if k is not Kind.CALL]
PIPE_BYTES = 1 << 20


def feed(data: bytes, chunks: list[int], close: bool) -> FrameReader:
    """Write ``data`` into a pipe in pieces, reading after each (as the dispatcher does
    when ``wait()`` says the pipe is readable); returns the reader, all frames read."""
    read_fd, write_fd = os.pipe()
    try:
        if hasattr(fcntl, "F_SETPIPE_SZ"):
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(read_fd, False)
        reader = FrameReader(read_fd)
        reader.frames = []  # type: ignore[attr-defined]
        start = 0
        for size in [*chunks, len(data)]:
            piece = data[start:start + size]
            start += len(piece)
            if piece:
                os.write(write_fd, piece)
            reader.frames += reader.read_available()  # type: ignore[attr-defined]
        if close:
            os.close(write_fd)
            write_fd = -1
            reader.frames += reader.read_available()  # type: ignore[attr-defined]
        return reader
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


frames_strategy = st.lists(st.tuples(st.sampled_from(FROM_WORKER),
                                     st.integers(0, 2**64 - 1),
                                     st.binary(max_size=300) | st.just(b"r" * 70_000)),
                           max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=frames_strategy, chunks=st.lists(st.integers(1, 5000), max_size=20))
def test_well_formed_frames_come_out_whole_however_the_pipe_splits_them(frames, chunks):
    data = b"".join(HEADER.pack(MAGIC, kind, task_id, len(body)) + body
                    for kind, task_id, body in frames)
    reader = feed(data, chunks, close=True)
    got = [(f.kind, f.task_id, bytes(f.body)) for f in reader.frames]  # type: ignore
    assert got == frames and reader.error is None and reader.eof


def header(kind: int, task_id: int, length: int) -> bytes:
    return struct.pack("!2sBQQ", MAGIC, kind, task_id, length)


hostile_strategy = st.one_of(
    st.binary(max_size=3000),  # anything at all
    st.builds(lambda k, t, n, tail: header(k, t, n) + tail,  # any header, then some bytes
              st.integers(0, 255), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
              st.binary(max_size=300)),
    st.builds(lambda k, t, body, cut: (header(k, t, len(body)) + body)[:cut],  # truncated
              st.sampled_from([int(k) for k in FROM_WORKER]), st.integers(0, 2**64 - 1),
              st.binary(max_size=500), st.integers(0, 520)),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(good=frames_strategy, bad=hostile_strategy, chunks=st.lists(st.integers(1, 700),
                                                                    max_size=8),
       close=st.booleans())
def test_any_bytes_end_as_frames_an_error_or_a_wait_never_an_exception(good, bad, chunks,
                                                                       close):
    data = b"".join(HEADER.pack(MAGIC, kind, task_id, len(body)) + body
                    for kind, task_id, body in good) + bad
    reader = feed(data, chunks, close)  # (returns: it never blocked, never raised)
    frames = reader.frames  # type: ignore[attr-defined]
    # What was well formed before the bad bytes came out as it was sent.
    assert [(f.kind, f.task_id, bytes(f.body)) for f in frames[:len(good)]] == good
    for frame in frames:
        assert isinstance(frame.kind, Kind) and frame.kind is not Kind.CALL
    if reader.error is not None:
        assert reader.error.startswith(("bytes that are not a reply frame",
                                        "a frame of"))


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@settings(max_examples=50, deadline=None)
@given(claimed=st.integers(1 << 20, _frames.MAX_BODY), sent=st.integers(0, 4096))
def test_a_length_header_is_never_allocated_for_what_it_merely_claims(claimed, sent):
    before = resident_bytes()
    reader = feed(header(Kind.RESULT, 1, claimed) + b"x" * sent, [], close=False)
    # The reader waits for the rest of the body (or refuses a claim beyond memory), but it
    # holds about what arrived, not what the header claims.
    assert resident_bytes() - before < 16 << 20
    assert reader.frames == [] and (reader.error is None or "more than memory" in reader.error)


# -- the dispatcher, fed by a fake worker ----------------------------------------------------

def fake_replies(task_id_of_running: int) -> st.SearchStrategy[bytes]:
    """What a task may write into its worker's reply pipe: garbage, a header claiming more
    than follows, a frame for a task never sent, a second READY, or a well-formed reply of
    its own making for the task it runs."""
    frame = st.builds(lambda kind, task_id, body: header(kind, task_id, len(body)) + body,
                      st.sampled_from([int(k) for k in FROM_WORKER]),
                      st.integers(0, 2**64 - 1) | st.just(task_id_of_running),
                      st.binary(max_size=200))
    return st.one_of(st.binary(min_size=1, max_size=500), frame,
                     st.builds(lambda t, n: header(Kind.RESULT, t, n),
                               st.just(task_id_of_running) | st.integers(0, 2**64 - 1),
                               st.integers(1, 2**64 - 1)))


ENDINGS = (pool.WorkerProtocolError, pool.ResultTransferError, pool.RemoteTaskError,
           pool.TaskTimeout)


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), then=st.sampled_from(["return", "exit"]))
def test_whatever_a_fake_worker_writes_ends_its_own_task_and_nothing_else(data, then):
    import multiprocessing
    with pool.ProcessPool(2, mp_context=multiprocessing.get_context("fork")) as p:
        neighbour = p.submit(tasks.sleep_then, 0.2, "neighbour")
        task_id = p.submit(tasks.current_task_id).result(60) + 1  # (the next task's id)
        written = data.draw(fake_replies(task_id))
        future = p.schedule(tasks.write_to_reply_pipe, (written, then), timeout=1)
        try:
            future.result(60)  # "done", or whatever a forged reply for it unpickles to
        except ENDINGS:
            pass
        except pool.WorkerDied:  # it wrote its bytes, then exited: they were all it said
            assert then == "exit"
        # It ended, and nothing else noticed: the neighbour, the next task, the dispatcher.
        assert neighbour.result(60) == "neighbour"
        assert p.submit(tasks.square, 7).result(60) == 49
        assert p._dispatcher.broken_error is None

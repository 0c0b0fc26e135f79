"""The wire (``pool._wire``): frames (``frames``), pipe mechanics (``pipes``), pickling
(``pickling``, ``picklers``) and exceptions on the wire (``exceptions``), in one process: the reader never blocks and never
trusts garbage."""

from __future__ import annotations

import os
import pickle
import threading

import pytest
from concurrent.futures.process import BrokenProcessPool

import pool
from pool import _platform
import tasks
from pool._wire import (exceptions as _exceptions, frames as _frames, pickling as _pickling,
                        pipes as _pipes)
from pool._wire.frames import Frame, FrameReader, Kind


@pytest.fixture
def pipe():
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    yield read_end, write_end
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass


def frame_bytes(kind, task_id, body):
    return _frames.HEADER.pack(_frames.MAGIC, kind, task_id, len(body)) + body


def test_frames_split_at_every_byte_are_reassembled(pipe):
    read_end, write_end = pipe
    data = frame_bytes(Kind.RESULT, 7, b"hello") + frame_bytes(Kind.READY, 0, b"")
    reader = FrameReader(read_end)
    frames = []
    for i in range(len(data)):
        os.write(write_end, data[i:i + 1])
        frames += reader.read_available()
    assert frames == [Frame(Kind.RESULT, 7, b"hello"), Frame(Kind.READY, 0, b"")]
    assert not reader.eof and reader.error is None


def test_a_large_body_is_read_into_its_own_buffer_without_blocking(pipe):
    read_end, write_end = pipe
    body = os.urandom(3 * 1024 * 1024)
    writer = threading.Thread(target=_frames.write_frame, args=(write_end, Kind.RESULT, 1, body))
    writer.start()
    reader = FrameReader(read_end)
    frames = []
    while not frames:
        frames = reader.read_available()  # returns whenever the pipe is empty
    writer.join()
    assert bytes(frames[0].body) == body


def test_end_of_file_mid_frame_is_eof_not_a_frame(pipe):
    read_end, write_end = pipe
    os.write(write_end, frame_bytes(Kind.RESULT, 1, b"x" * 100)[:40])
    os.close(write_end)
    reader = FrameReader(read_end)
    # A read that empties the pipe ends the call (the next wait() tells of more); the
    # following one finds end of file, and the partial frame is no frame.
    assert reader.read_available() == [] and not reader.eof
    assert reader.read_available() == []
    assert reader.eof


def test_a_read_that_empties_the_pipe_returns_without_another_system_call(pipe, monkeypatch):
    read_end, write_end = pipe
    os.write(write_end, frame_bytes(Kind.RESULT, 1, b"ok") + frame_bytes(Kind.RESULT, 2, b""))
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(fd) or real_read(fd, n))
    reader = FrameReader(read_end)
    assert reader.read_available() == [Frame(Kind.RESULT, 1, b"ok"), Frame(Kind.RESULT, 2, b"")]
    assert reads == [read_end]  # a short read: the pipe was empty, no EAGAIN to wait for


def test_garbage_is_an_error_and_reading_stops(pipe):
    read_end, write_end = pipe
    os.write(write_end, frame_bytes(Kind.RESULT, 1, b"ok") + b"\x00garbage that is long enough")
    reader = FrameReader(read_end)
    assert reader.read_available() == [Frame(Kind.RESULT, 1, b"ok")]
    assert "not a reply frame" in reader.error
    assert reader.read_available() == []


def test_a_call_frame_from_a_worker_is_garbage(pipe):
    read_end, write_end = pipe
    os.write(write_end, frame_bytes(Kind.CALL, 1, b""))
    reader = FrameReader(read_end)
    reader.read_available()
    assert reader.error


def test_blocking_frame_stream_round_trip(pipe):
    read_end, write_end = pipe
    os.set_blocking(read_end, True)
    _frames.write_frame(write_end, Kind.CALL, 3, _pickling.encode_call(b"fn", [b"args"]))
    stream = _frames.FrameStream(read_end)
    frame = stream.next()
    assert frame.kind is Kind.CALL and frame.task_id == 3
    fn_blob, args_blob, envelope = _pickling.decode_call(frame.body)
    assert envelope is None
    assert (bytes(fn_blob), bytes(args_blob)) == (b"fn", b"args")
    os.close(write_end)
    assert stream.next() is None


def test_importable_functions_go_by_reference_and_lambdas_by_value():
    assert pickle.loads(_pickling.dumps_callable(tasks.square)) is tasks.square
    assert b"cloudpickle" not in _pickling.dumps_callable(tasks.square)
    assert pickle.loads(_pickling.dumps_callable(lambda: 5))() == 5


def test_by_value_functions_keep_their_file_name():
    fn = pickle.loads(_pickling.dumps_callable(lambda: 1 / 0))
    assert fn.__code__.co_filename == __file__


def test_exceptions_travel_with_frames_and_chain():
    try:
        tasks.raise_chained()
    except RuntimeError as exc:
        error = _exceptions.decode_exception(_exceptions.encode_exception(exc))
    assert type(error) is RuntimeError and type(error.__context__) is FileNotFoundError
    assert error.__traceback__ is not None


def test_an_unsendable_result_raises_the_pickling_error_itself():
    kind, body = _pickling.encode_result(threading.Lock())
    assert kind is Kind.RAISED
    ok, error = _pickling.decode_outcome(Frame(kind, 1, b"".join(body)))
    assert not ok and type(error) is TypeError and "pickle" in str(error)  # as the stdlib
    assert any("return value, a lock" in note for note in error.__notes__)


def test_an_exception_that_cannot_be_pickled_sends_the_pickling_error_with_the_original():
    try:
        tasks.raise_unpicklable()
    except Exception as exc:
        error = _exceptions.decode_exception(_exceptions.encode_exception(exc))
    assert type(error) is TypeError and "pickle" in str(error)
    assert isinstance(error.__cause__, pool.RemoteTaskError)
    assert error.__cause__.type_name == "tasks.Unpicklable"
    assert "pickling in the worker failed" in error.__cause__.reason


def test_a_result_that_fails_to_unpickle_is_a_broken_process_pool_with_its_cause():
    class FromAnotherProcess:
        def __reduce__(self):
            return tasks._rebuild_fails_in_parent, (-1, ())

    ok, error = _pickling.decode_outcome(Frame(Kind.RESULT, 1, pickle.dumps(FromAnotherProcess())))
    assert not ok and isinstance(error, pool.ResultTransferError)
    assert isinstance(error, BrokenProcessPool) and error.__cause__ is not None


@pytest.mark.parametrize("kind, body", [(Kind.RAISED, b"junk"),
                                        (Kind.RAISED, pickle.dumps(("too", "short"))),
                                        (Kind.READY, b"")])
def test_a_body_that_is_not_the_envelope_is_malformed(kind, body):
    with pytest.raises(_frames.MalformedFrame):
        _pickling.decode_outcome(Frame(kind, 1, body))


def test_a_frame_too_large_for_memory_is_an_error_not_a_crash(pipe):
    read_end, write_end = pipe
    os.write(write_end, _frames.HEADER.pack(_frames.MAGIC, Kind.RESULT, 1, _frames.MAX_BODY) + b"x")
    reader = FrameReader(read_end)
    assert reader.read_available() == []
    assert "more than memory" in reader.error


def test_write_frames_writes_them_all_and_the_stream_reads_them_back():
    read_fd, write_fd = os.pipe()
    try:
        frames = [(1, [b"a" * 10]), (2, []), (3, [b"c" * 100, b"d" * 200])]
        assert _frames.write_frames(write_fd, Kind.CALL, frames) == 3
        big = bytes(range(256)) * 1024  # larger than one read: left in the pipe, as a file
        writer = threading.Thread(target=_frames.write_frames,
                                  args=(write_fd, Kind.CALL, [(4, [big]), (5, [b"after"])]))
        writer.start()
        stream = _frames.FrameStream(read_fd)
        got = [(f.task_id, bytes(f.body)) for f in (stream.next() for _ in range(3))]
        large = stream.next()
        assert isinstance(large.body, _frames.BodyReader) and large.task_id == 4
        assert large.body.read(10) == big[:10] and large.body.read() == big[10:]
        assert bytes(stream.next().body) == b"after"
        writer.join(10)
        os.close(write_fd)
        assert got == [(i, b"".join(parts)) for i, parts in frames]
        assert stream.next() is None  # end of file between frames
    finally:
        os.close(read_fd)


def test_write_frames_reports_how_many_reached_a_reader_that_went_away():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        assert _frames.write_frames(write_fd, Kind.CALL, [(1, [b"x"]), (2, [b"y"])]) == 0
    finally:
        os.close(write_fd)


def test_the_stream_refuses_a_truncated_header():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"\xb7P\x01")
    os.close(write_fd)
    try:
        with pytest.raises(EOFError):
            _frames.FrameStream(read_fd).next()
    finally:
        os.close(read_fd)


def test_a_large_bytes_argument_is_pickled_without_a_copy_and_a_bytearray_as_it_was(
        monkeypatch):
    # Through the pipe (tests/test_segments.py has the shared-memory side).
    monkeypatch.setattr(_platform, "SHARED_MEMORY", False)
    big = os.urandom(1 << 20)
    assert any(part is big for part in _pickling.dumps_arguments(len, (big,), {}))
    mutable = bytearray(1 << 20)
    parts = _pickling.dumps_arguments(len, (mutable,), {})
    mutable[:4] = b"late"  # after submit: the task must still get what was submitted
    (sent,), _ = pickle.loads(b"".join(parts))
    assert sent == bytearray(1 << 20)


def test_a_large_result_is_written_from_the_object_itself():
    big = os.urandom(1 << 20)
    kind, parts = _pickling.encode_result([big, "x"])
    assert kind is Kind.RESULT and any(part is big for part in parts)
    # A buffer of wider items is written as flat bytes (writev and the frame length agree).
    wide = pickle.PickleBuffer(__import__("array").array("i", range(1 << 18)))
    kind, parts = _pickling.encode_result(wide)
    assert _frames.size_of(parts) == len(b"".join(parts)) > (1 << 20)
    assert bytes(pickle.loads(b"".join(parts))) == bytes(wide.raw())


def test_a_large_call_is_unpickled_from_the_pipe_and_the_next_frame_follows_it(monkeypatch):
    monkeypatch.setattr(_platform, "SHARED_MEMORY", False)  # all of it through the pipe
    read_fd, write_fd = os.pipe()
    big = os.urandom(3 << 20)
    calls = [_pickling.encode_call(_pickling.dumps_callable(len), _pickling.dumps_arguments(len, a, {}))
             for a in [(big,), ("small",)]]
    writer = threading.Thread(target=_frames.write_frames,
                              args=(write_fd, Kind.CALL, list(enumerate(calls))))
    writer.start()
    try:
        stream = _frames.FrameStream(read_fd)
        loaded = []
        for _ in calls:
            fn_blob, source, _ = _pickling.decode_call(stream.next().body)
            loaded.append((pickle.loads(fn_blob), _pickling.load_arguments(source)))
        assert loaded == [(len, ((big,), {})), (len, (("small",), {}))]
    finally:
        writer.join(10)
        os.close(read_fd)
        os.close(write_fd)


class FailsToUnpickle:
    def __reduce__(self):
        return int, ("fails-to-unpickle",)


def test_a_large_call_that_fails_to_unpickle_is_skipped_to_its_end():
    from pool._worker import main as _worker
    read_fd, write_fd = os.pipe()
    # Unpickling stops at the middle argument, with a megabyte of the body still unread.
    bad = (os.urandom(1 << 20), FailsToUnpickle(), os.urandom(1 << 20))
    calls = [(1, _pickling.encode_call(_pickling.dumps_callable(len), _pickling.dumps_arguments(len, bad, {}))),
             (2, _pickling.encode_call(_pickling.dumps_callable(len), _pickling.dumps_arguments(len, ("ok",), {})))]
    writer = threading.Thread(target=_frames.write_frames, args=(write_fd, Kind.CALL, calls))
    writer.start()
    try:
        stream = _frames.FrameStream(read_fd)
        functions = _worker._FunctionCache()
        kind, body = _worker._run_call(functions, stream.next().body)
        assert kind is Kind.RAISED
        assert "fails-to-unpickle" in str(_exceptions.decode_exception(body))
        kind, body = _worker._run_call(functions, stream.next().body)
        assert (kind, pickle.loads(b"".join(body))) == (Kind.RESULT, 2)
    finally:
        writer.join(10)
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.skipif(not _platform.PIPE_RESIZE, reason="pipe sizes can be set on Linux only")
def test_a_pipe_grows_for_a_large_frame_and_shrinks_back_before_a_small_one(pipe):
    import fcntl
    read_end, write_end = pipe
    usual = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
    room = _pipes.PipeRoom(write_end)
    room.fit(100)
    assert fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ) == usual
    room.fit(1 << 20)
    assert fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ) == _pipes.PipeRoom.ROOM
    os.write(write_end, b"x" * (usual + 1))  # the reader is behind: cannot shrink yet
    room.fit(100)
    assert fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ) == _pipes.PipeRoom.ROOM
    os.read(read_end, usual + 1)
    room.fit(100)
    assert fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ) == usual


@pytest.mark.skipif(not (_platform.PACKET_PIPES and _platform.PROC),
                    reason="packet-mode pipes and a second reader are Linux only")
def test_a_second_reader_takes_back_whole_frames_the_first_has_not_read():
    read_fd, write_fd = os.pipe()
    thief = _pipes.second_reader(read_fd)
    try:
        assert thief is not None and _pipes.set_packet_mode(write_fd, True)
        for task_id in (1, 2, 3):  # one write, so one packet, per frame
            _frames.write_frames(write_fd, Kind.CALL, [(task_id, [b"x" * 100 * task_id])])
        stream = _frames.FrameStream(read_fd)
        assert stream.next().task_id == 1  # the worker reads one frame, not what follows
        assert _pipes.read_packets(thief) == [(Kind.CALL, 2), (Kind.CALL, 3)]
        assert _pipes.read_packets(thief) == []  # empty: never blocks
        assert os.get_blocking(read_fd)  # the worker's end is left blocking
    finally:
        for fd in (read_fd, write_fd, thief):
            if fd is not None:
                os.close(fd)


class PicklesACallWhilePickled:
    """A user ``__reduce__`` that itself pickles a call (so the kept pickler is busy)."""

    def __reduce__(self):
        inner = b"".join(_pickling.dumps_arguments(len, ("inner",), {}))
        return pickle.loads, (inner,)


def test_pickling_a_call_inside_a_reducer_and_after_a_failure_still_works():
    outer = b"".join(_pickling.dumps_arguments(len, (PicklesACallWhilePickled(), 2), {}))
    assert pickle.loads(outer) == (((("inner",), {}), 2), {})
    with pytest.raises(pool.ArgumentPicklingError):
        _pickling.dumps_arguments(len, (threading.Lock(),), {})
    assert pickle.loads(b"".join(_pickling.dumps_arguments(len, (1,), {"k": 2}))) == ((1,), {"k": 2})

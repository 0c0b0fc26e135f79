"""Frames and pickling, in one process: the reader never blocks and never trusts garbage."""

from __future__ import annotations

import os
import pickle
import threading

import pytest

import pool
import tasks
from pool import _wire
from pool._wire import Frame, FrameReader, Kind


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
    return _wire.HEADER.pack(_wire.MAGIC, kind, task_id, len(body)) + body


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
    writer = threading.Thread(target=_wire.write_frame, args=(write_end, Kind.RESULT, 1, body))
    writer.start()
    reader = FrameReader(read_end)
    frames = []
    while not frames:
        frames = reader.read_available()  # returns whenever the pipe is empty
    writer.join()
    assert frames[0].body == body


def test_end_of_file_mid_frame_is_eof_not_a_frame(pipe):
    read_end, write_end = pipe
    os.write(write_end, frame_bytes(Kind.RESULT, 1, b"x" * 100)[:40])
    os.close(write_end)
    reader = FrameReader(read_end)
    assert reader.read_available() == []
    assert reader.eof


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
    _wire.write_frame(write_end, Kind.CALL, 3, _wire.encode_call(b"fn", b"args"))
    stream = _wire.FrameStream(read_end)
    frame = stream.next()
    assert frame.kind is Kind.CALL and frame.task_id == 3
    fn_blob, args_blob = _wire.decode_call(frame.body)
    assert (bytes(fn_blob), bytes(args_blob)) == (b"fn", b"args")
    os.close(write_end)
    assert stream.next() is None


def test_importable_functions_go_by_reference_and_lambdas_by_value():
    assert pickle.loads(_wire.dumps_callable(tasks.square)) is tasks.square
    assert b"cloudpickle" not in _wire.dumps_callable(tasks.square)
    assert pickle.loads(_wire.dumps_callable(lambda: 5))() == 5


def test_by_value_functions_keep_their_file_name():
    fn = pickle.loads(_wire.dumps_callable(lambda: 1 / 0))
    assert fn.__code__.co_filename == __file__


def test_exceptions_travel_with_frames_and_chain():
    try:
        tasks.raise_chained()
    except RuntimeError as exc:
        error = _wire.decode_exception(_wire.encode_exception(exc))
    assert type(error) is RuntimeError and type(error.__context__) is FileNotFoundError
    assert error.__traceback__ is not None


def test_an_unsendable_result_is_reported_by_type():
    kind, body = _wire.encode_result(threading.Lock())
    assert kind is Kind.UNSENDABLE
    ok, error = _wire.decode_outcome(Frame(kind, 1, body))
    assert not ok and isinstance(error, pool.ResultTransferError)
    assert error.type_name == "lock" and "pickle" in error.reason


@pytest.mark.parametrize("kind, body", [(Kind.RAISED, b"junk"), (Kind.UNSENDABLE, b"junk"),
                                        (Kind.RAISED, pickle.dumps(("too", "short"))),
                                        (Kind.READY, b"")])
def test_a_body_that_is_not_the_envelope_is_malformed(kind, body):
    with pytest.raises(_wire.MalformedFrame):
        _wire.decode_outcome(Frame(kind, 1, body))


def test_a_frame_too_large_for_memory_is_an_error_not_a_crash(pipe):
    read_end, write_end = pipe
    os.write(write_end, _wire.HEADER.pack(_wire.MAGIC, Kind.RESULT, 1, _wire.MAX_BODY) + b"x")
    reader = FrameReader(read_end)
    assert reader.read_available() == []
    assert "more than memory" in reader.error


def test_write_frames_writes_them_all_and_the_stream_reads_them_back():
    read_fd, write_fd = os.pipe()
    try:
        frames = [(1, b"a" * 10), (2, b""), (3, b"c" * 300)]
        assert _wire.write_frames(write_fd, Kind.CALL, frames) == 3
        big = bytes(range(256)) * 1024  # larger than one read: read into its own buffer
        writer = threading.Thread(target=_wire.write_frames,
                                  args=(write_fd, Kind.CALL, [(4, big)]))
        writer.start()
        stream = _wire.FrameStream(read_fd)
        got = [stream.next() for _ in range(4)]
        writer.join(10)
        os.close(write_fd)
        assert [(f.task_id, bytes(f.body)) for f in got] == frames + [(4, big)]
        assert stream.next() is None  # end of file between frames
    finally:
        os.close(read_fd)


def test_write_frames_reports_how_many_reached_a_reader_that_went_away():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        assert _wire.write_frames(write_fd, Kind.CALL, [(1, b"x"), (2, b"y")]) == 0
    finally:
        os.close(write_fd)


def test_the_stream_refuses_a_truncated_header():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"\xb7P\x01")
    os.close(write_fd)
    try:
        with pytest.raises(EOFError):
            _wire.FrameStream(read_fd).next()
    finally:
        os.close(read_fd)

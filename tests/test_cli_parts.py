"""The command line's pure parts, without processes: input records, output lines, the job
log, the halt rule and the progress line (the commands themselves: test_cli.py)."""

from __future__ import annotations

import io
import os
import threading

import pytest

from pool._cli.inputs import counter, parse, read_inputs, records_of
from pool._cli.lines import Lines, OutputClosed, OutputFailed, Window, WriteAbandoned
from pool._cli.joblog import COLUMNS, Entry, Joblog, JoblogError, escape, read_joblog
from pool._cli.output import (Failure, ProgressLine, json_failure, json_result, plain_failure,
                              plain_result, summary_line, tagged)
from pool._cli.options import Halt


def never() -> bool:
    return False


def records(data: bytes, nul: bool = False) -> list[bytes]:
    import tempfile
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.seek(0)
        return list(records_of(file.fileno(), nul))


def test_lines_lose_their_ending_crlf_included_and_blank_lines_are_inputs():
    assert records(b"a\r\n\nb\n") == [b"a", b"", b"b"]
    assert records(b"a\nlast without newline") == [b"a", b"last without newline"]
    assert records(b"") == []


def test_nul_separated_records_keep_newlines_and_carriage_returns():
    assert records(b"a\nb\0c\r\0", nul=True) == [b"a\nb", b"c\r"]


def test_records_longer_than_a_read_block_arrive_whole():
    big = b"x" * 200_000
    assert records(big + b"\n" + big) == [big, big]


def test_jsonl_lines_become_arguments_and_blank_lines_are_skipped():
    items = list(read_inputs([b"[1, 2]", b"  ", b'{"a": 1}', b"3", b"nope"], jsonl=True))
    assert [(i.seq, i.args, i.kwargs) for i in items[:3]] == [
        (1, (1, 2), {}), (2, (), {"a": 1}), (3, (3,), {})]
    assert items[3].seq == 4 and items[3].error is not None
    assert items[3].error.error_type == "JSONDecodeError"
    assert items[3].error.message == "cannot parse 'nope' as JSON: Expecting value at column 1"


@pytest.mark.parametrize("kind, text, value", [
    ("str", " 7 ", " 7 "), ("int", " 7 ", 7), ("int", "-1_000", -1000), ("float", "1e3", 1e3),
    ("json", '{"a": [1, null]}', {"a": [1, None]}), ("json", "[1, 2]", [1, 2]),
    ("literal", "(1, 'b', {2})", (1, "b", {2})), ("literal", "None", None),
])
def test_parse_makes_the_one_argument_of_its_kind(kind, text, value):
    item = parse(5, text, kind=kind)
    assert item.error is None and item.args == (value,) and item.kwargs == {}
    assert item.value == value and item.text == text


@pytest.mark.parametrize("kind, text, error_type, message", [
    ("int", "x", "ValueError", "cannot parse 'x' as int"),
    ("int", "", "ValueError", "cannot parse '' as int"),
    ("float", "1,5", "ValueError", "cannot parse '1,5' as float"),
    ("json", "[1,", "JSONDecodeError",
     "cannot parse '[1,' as JSON: Expecting value at column 4"),
    ("literal", "f(1)", "ValueError", "cannot parse 'f(1)' as a Python literal"),
    ("literal", "(1", "SyntaxError", "cannot parse '(1' as a Python literal: "),
    ("literal", "(" * 100_000, "", "cannot parse '((((("),
])
def test_a_record_that_does_not_parse_is_an_input_that_says_why(kind, text, error_type,
                                                                 message):
    (item,) = read_inputs([text.encode()], jsonl=False, kind=kind)
    assert item.seq == 1 and item.args == () and item.value == text
    assert item.error is not None and item.error.message.startswith(message)
    assert item.error.error_type.startswith(error_type)
    assert len(item.error.message) < 200   # a long record is cut short in the message


def test_bytes_that_are_not_utf8_survive_as_surrogates():
    (item,) = read_inputs([b"\xff"], jsonl=False)
    assert item.text.encode("utf-8", "surrogateescape") == b"\xff"
    assert parse(1, "x", jsonl=False).args == ("x",)


def count(fd: int, nul: bool, jsonl: bool) -> int | None:
    counting = counter(fd, nul, jsonl)
    return None if counting is None else counting()


def test_count_reads_a_regular_file_without_moving_its_offset(tmp_path):
    path = tmp_path / "inputs"
    path.write_bytes(b"1\n2\n\n3")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert count(fd, nul=False, jsonl=False) == 4
        assert count(fd, nul=False, jsonl=True) == 3
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)
    read, write = os.pipe()
    try:
        assert count(read, nul=False, jsonl=False) is None
    finally:
        os.close(read)
        os.close(write)


def test_plain_lines_tell_failures_from_results():
    assert plain_result("a\nb\rc") == "a\\nb\\rc"
    assert plain_result("!important") == "\\!important"
    failure = Failure("error", "ValueError", "bad\nvalue", "")
    assert plain_failure(failure) == "!ValueError: bad value"
    assert plain_failure(Failure("error", "KeyboardInterrupt", "", "")) == "!KeyboardInterrupt"
    assert tagged("in\tput", "4") == "in\\tput\t4"


def test_json_lines_are_objects_with_the_value_or_the_error():
    import json
    assert json.loads(json_result(3, "x", "[1, 2]")) == {
        "seq": 3, "input": "x", "ok": True, "value": [1, 2]}
    failure = Failure("died", "WorkerDied", "worker pid 42 died", "", 0, "SIGSEGV", 42)
    assert json.loads(json_failure(4, "y", failure))["error"] == {
        "type": "WorkerDied", "message": "worker pid 42 died", "kind": "died", "exitcode": 0,
        "signal": "SIGSEGV", "pid": 42}
    # The message is the exception's alone, whole: its type is beside it, not in it.
    failure = Failure("error", "ValueError", "two\nlines", "")
    assert json.loads(json_failure(5, "z", failure))["error"]["message"] == "two\nlines"


def test_the_joblog_reads_back_what_it_wrote_last_entry_winning(tmp_path):
    path = tmp_path / "log"
    log = Joblog.open(str(path), append=False)
    log.write([Entry(1, 0.0, 0.5, "error", 1, None, 7, 1, "KeyError", "a\tb"),
               Entry(2, 0.0, 0.5, "ok", 0, None, 7, 1, "", "c")], never)
    log.write([Entry(1, 0.0, 0.5, "ok", 0, None, 8, 2, "", "a\tb")], never)
    log.close()
    assert path.read_text().splitlines()[0] == "\t".join(COLUMNS)
    finished = read_joblog(str(path))
    assert finished[1].ok and finished[1].escaped_input == escape("a\tb") == "a\\tb"
    assert finished[2].ok


def test_a_joblog_cut_off_mid_line_is_read_up_to_the_cut(tmp_path):
    path = tmp_path / "log"
    path.write_text("\t".join(COLUMNS) + "\n1\t0\t0\tok\t0\t-\t1\t1\t-\tx\n2\t0")
    assert list(read_joblog(str(path))) == [1]


def test_what_is_not_a_joblog_is_refused(tmp_path):
    path = tmp_path / "log"
    path.write_text("hello\n")
    with pytest.raises(JoblogError, match="not a job log"):
        read_joblog(str(path))
    with pytest.raises(JoblogError, match="cannot read"):
        read_joblog(str(tmp_path / "missing"))


def test_halt_by_count_and_by_percentage_once_ten_finished():
    assert Halt(True, 2, None).reached(failed=2, finished=2)
    assert not Halt(True, 2, None).reached(failed=1, finished=50)
    half = Halt(False, None, 50.0)
    assert not half.reached(failed=5, finished=5)
    assert half.reached(failed=5, finished=10)
    assert not half.reached(failed=4, finished=10)


def test_progress_draws_a_bar_on_a_terminal_and_lines_elsewhere():
    now = [0.0]
    stream = io.StringIO()
    bar = ProgressLine(stream, tty=True, interval=3.0, clock=lambda: now[0])
    now[0] = 2.0
    bar.tick(ok=9, failed=1, running=2, total=20)
    assert stream.getvalue() == ("\r\x1b[K[##########..........] 10/20 done, 1 failed, "
                                 "2 running, 5.0/s, ETA 0:02")
    bar.clear()
    assert stream.getvalue().endswith("\r\x1b[K")
    plain = io.StringIO()
    lines = ProgressLine(plain, tty=False, interval=3.0, clock=lambda: now[0])
    now[0] = 3.0
    lines.tick(ok=1, failed=0, running=1, total=None)   # only 1 s since it started
    assert plain.getvalue() == ""
    now[0] = 5.5
    lines.tick(ok=1, failed=0, running=1, total=None)
    assert plain.getvalue() == "1 done, 0 failed, 1 running, 0.3/s, ETA ?\n"
    assert summary_line(5, 1, 2.25, not_finished=3) == "5 ok, 1 failed, 3 not finished, 2.2 s"


def test_records_split_in_linear_time_and_across_blocks():
    long = b"x" * 300_000                        # one record over several 64 KiB blocks
    assert records(long + b"\n" + b"y\n" * 50_000) == [long] + [b"y"] * 50_000


def test_the_counter_counts_from_where_reading_was_when_it_was_made(tmp_path):
    path = tmp_path / "inputs"
    path.write_bytes(b"a\nb\nc\nd")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 2)                       # "a" was read before
        counting = counter(fd, nul=False, jsonl=False)
        assert counting is not None
        os.read(fd, 4)                       # the reader goes on meanwhile
        assert counting() == 3
    finally:
        os.close(fd)
    read_end, write_end = os.pipe()
    try:
        assert counter(read_end, nul=False, jsonl=False) is None    # a pipe: no total
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_window_holds_the_reader_at_its_size_until_a_place_is_given_back():
    window = Window(2)
    assert window.take() and window.take()
    taken = threading.Event()
    reader = threading.Thread(target=lambda: window.take() and taken.set(), daemon=True)
    reader.start()
    assert not taken.wait(0.5)               # full: the reader waits
    window.give_back()
    assert taken.wait(10)
    reader.join(10)
    window.stopped = True                    # stopped: take says so at once, full or not
    assert not window.take()


def test_lines_keep_input_order_and_write_the_rest_past_the_gaps_at_an_early_end(tmp_path):
    path = tmp_path / "out"
    with open(path, "wb") as out:
        lines = Lines(out.fileno(), Window(10), ordered=True, joblog=None, give_up=never)
        lines.put(2, "two")
        lines.flush()
        assert path.read_bytes() == b""          # waits for line 1
        lines.put(1, "one")
        lines.put(3, None)                       # (an input with no line: resumed past)
        lines.put(5, "five")
        lines.flush()
        assert path.read_bytes() == b"one\ntwo\n"
        lines.put_the_rest()
        lines.flush()
        assert path.read_bytes() == b"one\ntwo\nfive\n"


def test_a_job_log_entry_is_written_only_once_its_line_is_out(tmp_path):
    log_path = tmp_path / "log"
    log = Joblog.open(str(log_path), append=False)
    entry = Entry(1, 0.0, 0.5, "ok", 0, None, 7, 1, "", "a")
    with open(tmp_path / "out", "wb") as out:
        lines = Lines(out.fileno(), Window(10), ordered=True, joblog=log, give_up=never)
        lines.put(1, "a", entry)
        assert len(log_path.read_text().splitlines()) == 1      # the header only
        lines.flush()
        assert len(log_path.read_text().splitlines()) == 2
    log.close()


def test_a_blocked_write_gives_up_when_asked_and_keeps_what_it_did_not_write():
    read_end, write_end = os.pipe()
    asked = []

    def give_up() -> bool:
        asked.append(1)
        return True
    try:
        lines = Lines(write_end, Window(10), ordered=False, joblog=None, give_up=give_up)
        with pytest.raises(WriteAbandoned):
            for seq in range(1, 100):            # more than a pipe holds: it blocks
                lines.put(seq, "x" * 10_000)
        assert asked and lines.unwritten
        while os.read(read_end, 1 << 16) and lines.unwritten:   # the reader comes back
            try:
                lines.flush()
            except WriteAbandoned:
                pass
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_closed_pipe_and_a_full_device_are_the_two_output_errors():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with pytest.raises(OutputClosed):
            lines = Lines(write_end, Window(10), ordered=False, joblog=None, give_up=never)
            lines.put(1, "x")
            lines.flush()
    finally:
        os.close(write_end)
    if os.path.exists("/dev/full"):
        with open("/dev/full", "wb") as full:
            lines = Lines(full.fileno(), Window(10), ordered=False, joblog=None,
                          give_up=never)
            lines.put(1, "x")
            with pytest.raises(OutputFailed, match="No space left"):
                lines.flush()


def test_a_blocked_write_gives_up_at_a_line_break():
    read_end, write_end = os.pipe()
    try:
        lines = Lines(write_end, Window(10), ordered=False, joblog=None, give_up=lambda: True)
        with pytest.raises(WriteAbandoned):
            for seq in range(1, 100):
                lines.put(seq, "y" * 999)         # 1000-byte lines: 4 to a PIPE_BUF write
        os.set_blocking(read_end, False)
        data = b""
        while True:
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                break
            data += chunk
        assert data and data.endswith(b"\n") and len(data) % 1000 == 0
    finally:
        os.close(read_end)
        os.close(write_end)


def test_lines_lost_at_a_closed_output_are_dropped_and_the_written_ones_logged(tmp_path):
    log_path = tmp_path / "log"
    log = Joblog.open(str(log_path), append=False)
    read_end, write_end = os.pipe()
    try:
        lines = Lines(write_end, Window(10), ordered=False, joblog=log, give_up=never)
        lines.put(1, "first", Entry(1, 0.0, 0.1, "ok", 0, None, 7, 1, "", "1"))
        lines.flush()
        os.close(read_end)
        lines.put(2, "second", Entry(2, 0.0, 0.1, "ok", 0, None, 7, 1, "", "2"))
        with pytest.raises(OutputClosed):
            lines.flush()
        assert [entry.seq for entry in lines.dropped] == [2]
        assert [line.split("\t")[0] for line in log_path.read_text().splitlines()[1:]] == ["1"]
    finally:
        os.close(write_end)
        log.close()


def test_a_seq_that_is_a_digit_but_not_a_number_is_not_an_entry(tmp_path):
    path = tmp_path / "log"
    path.write_text("\t".join(COLUMNS) + "\n\u00b2\t0\t0\tok\t0\t-\t1\t1\t-\tx\n")
    with pytest.raises(JoblogError, match="not a job log entry"):
        read_joblog(str(path))

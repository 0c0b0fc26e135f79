"""The command line's pure parts, without processes: input records, output lines, the job
log, the halt rule and the progress line (the commands themselves: test_cli.py)."""

from __future__ import annotations

import io
import os

import pytest

from pool._cli_inputs import count, parse, read_inputs, records_of
from pool._cli_joblog import HEADER, Entry, Joblog, JoblogError, escape, read_joblog
from pool._cli_output import (Failure, Progress, json_failure, json_result, plain_failure,
                              plain_result, summary_line, tagged)
from pool._cli_run import Halt


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
    assert items[3].seq == 4 and items[3].error.startswith("JSONDecodeError")


def test_bytes_that_are_not_utf8_survive_as_surrogates():
    (item,) = read_inputs([b"\xff"], jsonl=False)
    assert item.text.encode("utf-8", "surrogateescape") == b"\xff"
    assert parse(1, "x", jsonl=False).args == ("x",)


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
    failure = Failure("error", "ValueError", "ValueError: bad\nvalue", "")
    assert plain_failure(failure) == "!ValueError: bad\\nvalue"
    assert tagged("in\tput", "4") == "in\\tput\t4"


def test_json_lines_are_objects_with_the_value_or_the_error():
    import json
    assert json.loads(json_result(3, "x", "[1, 2]")) == {
        "seq": 3, "input": "x", "ok": True, "value": [1, 2]}
    failure = Failure("died", "WorkerDied", "WorkerDied: ...", "", 0, "SIGSEGV", 42)
    assert json.loads(json_failure(4, "y", failure))["error"] == {
        "type": "WorkerDied", "message": "WorkerDied: ...", "kind": "died", "exitcode": 0,
        "signal": "SIGSEGV", "pid": 42}


def test_the_joblog_reads_back_what_it_wrote_last_entry_winning(tmp_path):
    path = tmp_path / "log"
    log = Joblog(open(path, "w"), write_header=True)
    log.write(Entry(1, 0.0, 0.5, "error", 1, None, 7, 1, "KeyError", "a\tb"))
    log.write(Entry(2, 0.0, 0.5, "ok", 0, None, 7, 1, "", "c"))
    log.write(Entry(1, 0.0, 0.5, "ok", 0, None, 8, 2, "", "a\tb"))
    log.close()
    assert path.read_text().splitlines()[0] == "\t".join(HEADER)
    finished = read_joblog(str(path))
    assert finished[1].ok and finished[1].escaped_input == escape("a\tb") == "a\\tb"
    assert finished[2].ok


def test_a_joblog_cut_off_mid_line_is_read_up_to_the_cut(tmp_path):
    path = tmp_path / "log"
    path.write_text("\t".join(HEADER) + "\n1\t0\t0\tok\t0\t-\t1\t1\t-\tx\n2\t0")
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
    bar = Progress(stream, tty=True, interval=3.0, clock=lambda: now[0])
    now[0] = 2.0
    bar.tick(ok=9, failed=1, running=2, total=20)
    assert stream.getvalue() == ("\r\x1b[K[##########..........] 10/20 done, 1 failed, "
                                 "2 running, 5.0/s, ETA 0:02")
    bar.clear()
    assert stream.getvalue().endswith("\r\x1b[K")
    plain = io.StringIO()
    lines = Progress(plain, tty=False, interval=3.0, clock=lambda: now[0])
    now[0] = 3.0
    lines.tick(ok=1, failed=0, running=1, total=None)   # only 1 s since it started
    assert plain.getvalue() == ""
    now[0] = 5.5
    lines.tick(ok=1, failed=0, running=1, total=None)
    assert plain.getvalue() == "1 done, 0 failed, 1 running, 0.3/s, ETA ?\n"
    assert summary_line(5, 1, 2.25, not_run=3) == "5 ok, 1 failed, 3 not run, 2.2 s"

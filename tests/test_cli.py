"""``python -m pool``: the demo and the map command, run as real commands.

``map`` runs with the tests directory as its working directory, so that the functions of
``cli_functions`` are importable by the command (``cli_functions:NAME``); those that record
what ran, write their pid or wait for a gate use the scratch directory ``CLI_TEST_DIR``.
Nothing here waits for a time and hopes: the command and the test synchronise through
files (a pid file, a gate, the job log) and pipes; the only times asserted are generous
upper bounds that prove the command did not wait for a task that sleeps 60 s.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import threading
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

import pool
from pool import _platform
from helpers import START_METHODS, TESTS_DIR, process_exists, session_members, wait_until

MAP = [sys.executable, "-m", "pool", "map"]

# A command that must not wait for a 60 s task must end well within this.
QUICK = 20.0

JOBLOG_HEADER = "Seq\tStart\tRuntime\tOutcome\tExitcode\tSignal\tPid\tAttempts\tError\tInput"


class Result(NamedTuple):
    rc: int
    out: str      # decoded with surrogateescape, line endings untouched
    err: str
    seconds: float


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def run(*args, stdin: str | bytes | None = None, timeout: float = 60, env=None,
        cwd: Path | str = TESTS_DIR) -> Result:
    """``python -m pool ARGS`` to completion (a hard timeout)."""
    if isinstance(stdin, str):
        stdin = stdin.encode("utf-8", "surrogateescape")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pool", *args], input=stdin,
                          capture_output=True, timeout=timeout, cwd=str(cwd), env=env,
                          stdin=None if stdin is not None else subprocess.DEVNULL)
    return Result(proc.returncode, _decode(proc.stdout), _decode(proc.stderr),
                  time.monotonic() - started)


def run_map(*args, **kwargs) -> Result:
    return run("map", *args, **kwargs)


def env_for(directory: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, CLI_TEST_DIR=str(directory), **extra)


def ran(directory: Path) -> list[str]:
    """The inputs ``cli_functions.act`` recorded in ``directory``, in the order they ran."""
    path = directory / "ran"
    return path.read_text().splitlines() if path.exists() else []


def pid_in(path: Path) -> int:
    assert wait_until(path.exists, 30), f"{path.name} never appeared"
    return int(path.read_text())


def read_joblog(path: Path) -> tuple[list[str], dict[int, list[str]]]:
    lines = path.read_text().splitlines()
    entries: dict[int, list[str]] = {}
    for line in lines[1:]:
        fields = line.split("\t")
        assert len(fields) == 10, line
        entries[int(fields[0])] = fields
    return lines, entries


def usage_error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


class Command:
    """``python -m pool map ARGS`` running in its own session (as a shell job would be:
    its workers lead process groups of their own but stay in that session), with standard
    output a pipe read line by line and standard error a file; always killed, with what
    is left of its session, on close."""

    def __init__(self, *args: str, tmp_path: Path, env=None, stdin=subprocess.DEVNULL,
                 preexec_fn=None) -> None:
        self.stderr_path = tmp_path / f"stderr-{time.monotonic_ns()}"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen([*MAP, *args], stdin=stdin, stdout=subprocess.PIPE,
                                         stderr=stderr, cwd=str(TESTS_DIR), env=env,
                                         start_new_session=True, preexec_fn=preexec_fn)
        self.started = time.monotonic()
        self.pending = b""

    def read_line(self, timeout: float = 30) -> bytes:
        """The next line of standard output, read from the raw pipe."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([fd], [], [], left)[0], (
                f"no line in {timeout} s; so far {self.pending!r}; stderr:\n{self.stderr()}")
            chunk = os.read(fd, 65536)
            assert chunk, f"end of output before a line; so far {self.pending!r}"
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line + b"\n"

    def rest(self, timeout: float = 30) -> bytes:
        """The rest of standard output, to its end."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        data, self.pending = self.pending, b""
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([fd], [], [], left)[0], (
                f"output did not end in {timeout} s; so far {data!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk

    def close_stdout(self) -> None:
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def wait(self, timeout: float = QUICK) -> tuple[int, float]:
        """Exit status, and seconds from the start of the command to its end."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the command did not end in {timeout} s; stderr:\n"
                                 f"{self.stderr()}") from None
        return rc, time.monotonic() - self.started

    def stderr(self) -> str:
        return _decode(self.stderr_path.read_bytes())

    def session_left(self) -> list[int]:
        """What is left of the command's session once it has ended (multiprocessing's own
        helpers, such as a forkserver, see their parent gone and exit by themselves)."""
        wait_until(lambda: not session_members(self.proc.pid), 10)
        return session_members(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in session_members(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def command(tmp_path):
    """Starts ``Command``s, and closes each at the end of the test."""
    started: list[Command] = []

    def start(*args: str, **kwargs) -> Command:
        kwargs.setdefault("tmp_path", tmp_path)
        cmd = Command(*args, **kwargs)
        started.append(cmd)
        return cmd
    yield start
    for cmd in started:
        cmd.close()


# -- the demo --------------------------------------------------------------------------------

@pytest.mark.parametrize("method", START_METHODS)
def test_demo_explains_both_deaths_and_the_timeout_and_the_rest_succeeds(method):
    proc = run("demo", "--start-method", method, timeout=120)
    assert proc.rc == 0, proc.err
    out = proc.out
    assert out.count(": ok,") == 4
    assert "signal SIGSEGV" in out and "Fatal Python error: Segmentation fault" in out
    assert "in segfault" in out
    assert "signal SIGKILL" in out and "killed from outside" in out
    assert "TaskTimeout" in out and "in catastrophic_regex" in out
    assert "the pool carried on" in out


# -- the function --------------------------------------------------------------------------

def test_map_over_arguments_prints_results_in_order():
    proc = run_map("-j", "2", "builtins:len", "a", "bbb", "cc")
    assert proc.rc == 0, proc.err
    assert proc.out == "1\n3\n2\n"


def test_a_function_of_the_tests_module_runs_in_the_workers():
    proc = run_map("-j", "2", "cli_functions:fail_odd", "2", "4")
    assert (proc.rc, proc.out) == (0, "2\n4\n"), proc.err


SCRIPT = '''\
SUFFIX = "!"   # a global of the script: the function must travel with its module


def shout(text):
    return text.upper() + SUFFIX.replace("!", "?")
'''


def test_a_script_function_by_absolute_path(tmp_path):
    (tmp_path / "shout_script.py").write_text(SCRIPT)
    proc = run_map("-j", "2", f"{tmp_path}/shout_script.py:shout", "ab", "c")
    assert (proc.rc, proc.out) == (0, "AB?\nC?\n"), proc.err


@pytest.mark.parametrize("method", ["spawn", None])
def test_a_script_function_by_relative_path(tmp_path, method):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "shout_script.py").write_text(SCRIPT)
    start = ["--start-method", method] if method else []
    for spec in ("./sub/shout_script.py:shout", "sub/shout_script.py:shout"):
        proc = run_map("-j", "2", *start, spec, "ab", "c", cwd=tmp_path)
        assert (proc.rc, proc.out) == (0, "AB?\nC?\n"), (spec, proc.err)


# -- input -----------------------------------------------------------------------------------

def test_stdin_streams_a_line_is_run_before_the_input_ends(command):
    cmd = command("-j", "2", "builtins:len", stdin=subprocess.PIPE)
    stdin = cmd.proc.stdin
    stdin.write(b"abc\n")
    stdin.flush()
    # stdin stays open: the line must come back all the same.
    assert cmd.read_line(30) == b"3\n"
    stdin.write(b"de\n")
    stdin.close()
    assert cmd.rest() == b"2\n"
    rc, _ = cmd.wait(30)
    assert rc == 0, cmd.stderr()


@pytest.mark.timeout(180)
def test_a_million_lines_stream_through_in_flat_memory(tmp_path):
    """``seq 1 1000000 | map builtins:len --chunksize 1000``: every line, in order, and the
    command (with the workers it waited for) never over 100 MiB."""
    seq = subprocess.Popen(["seq", "1", "1000000"], stdout=subprocess.PIPE)
    try:
        with open(tmp_path / "stderr", "wb") as stderr:
            proc = subprocess.Popen([*MAP, "builtins:len", "--chunksize", "1000", "-j", "2"],
                                    stdin=seq.stdout, stdout=subprocess.PIPE, stderr=stderr,
                                    cwd=str(TESTS_DIR))
    finally:
        seq.stdout.close()
    try:
        chunks = []
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + 150
        while True:
            assert select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0], \
                "the output stalled"
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        seq.kill()
        seq.wait()
    assert proc.returncode == 0, (tmp_path / "stderr").read_text()
    out = b"".join(chunks)
    # The length of every number from 1 to 1000000, in input order.
    expected = b"".join(b"%d\n" % digits * (9 * 10 ** (digits - 1)) for digits in range(1, 7))
    expected += b"7\n"
    assert out.count(b"\n") == 1_000_000
    assert out == expected
    assert usage.ru_maxrss < 100 * 1024, f"max RSS {usage.ru_maxrss} KiB"


def test_arg_file_is_read(tmp_path):
    (tmp_path / "inputs").write_text("a\nbbb\ncc\n")
    proc = run_map("builtins:len", "-j", "2", "-a", str(tmp_path / "inputs"))
    assert (proc.rc, proc.out) == (0, "1\n3\n2\n"), proc.err


def test_arg_file_dash_is_stdin():
    proc = run_map("builtins:len", "-j", "2", "-a", "-", stdin="a\nbbb\n")
    assert (proc.rc, proc.out) == (0, "1\n3\n"), proc.err


def test_a_last_line_without_a_newline_is_an_input():
    proc = run_map("builtins:len", "-j", "2", stdin="a\nbbb")
    assert (proc.rc, proc.out) == (0, "1\n3\n"), proc.err


def test_no_input_no_output_exit_0():
    proc = run_map("builtins:len", stdin="")
    assert (proc.rc, proc.out) == (0, ""), proc.err


def test_arguments_and_an_arg_file_together_are_a_usage_error(tmp_path):
    (tmp_path / "inputs").write_text("a\n")
    proc = run_map("builtins:len", "x", "-a", str(tmp_path / "inputs"))
    assert proc.rc == 255
    assert len(usage_error_lines(proc.err)) == 1 and "Traceback" not in proc.err
    assert proc.out == ""


def test_null_separated_inputs_keep_their_newlines():
    proc = run_map("-0", "-j", "2", "builtins:repr", stdin=b"a\nb\0cc\0")
    assert (proc.rc, proc.out) == (0, "'a\\nb'\n'cc'\n"), proc.err


def test_crlf_line_endings_are_stripped_and_a_blank_line_is_an_input():
    proc = run_map("-j", "2", "builtins:repr", stdin=b"a\r\n\r\nbbb\r\n\n")
    assert proc.rc == 0, proc.err
    assert proc.out == "'a'\n''\n'bbb'\n''\n"
    assert proc.out.count("\n") == 4     # one output line per input line


def test_none_result_of_a_blank_line_keeps_the_lines_aligned():
    proc = run_map("-j", "2", "cli_functions:act", stdin="x\n\ny\n")
    assert (proc.rc, proc.out) == (0, "x\n\ny\n"), proc.err


def test_bytes_that_are_not_utf8_round_trip():
    data = b"\xff\n" + b"caf\xc3\xa9\n" + b"a\xfeb\n"
    proc = subprocess.run([*MAP, "-j", "2", "builtins:str"], input=data,
                          capture_output=True, timeout=60, cwd=str(TESTS_DIR))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data


def test_json_output_of_bytes_that_are_not_utf8_is_valid_and_lossless():
    """``--json`` is valid JSON text (UTF-8), and lossless: the byte survives as the
    surrogate that surrogateescape makes of it."""
    proc = subprocess.run([*MAP, "-j", "2", "--json", "builtins:str"], input=b"a\xffb\n",
                          capture_output=True, timeout=60, cwd=str(TESTS_DIR))
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.decode("utf-8"))     # strict: JSON text is UTF-8
    for field in ("input", "value"):
        assert line[field].encode("utf-8", "surrogateescape") == b"a\xffb"


JSONL_INPUT = '[1, 2]\n{"a": 1, "b": [true]}\n5\n\n   \nnot json\n"s"\n'


def test_jsonl_lists_are_args_objects_kwargs_scalars_one_argument():
    proc = run_map("--jsonl", "-j", "2", "cli_functions:show", stdin=JSONL_INPUT)
    assert proc.rc == 1, proc.err
    lines = proc.out.splitlines()
    assert len(lines) == 5      # the blank lines are skipped
    assert json.loads(lines[0]) == [[1, 2], {}]
    assert json.loads(lines[1]) == [[], {"a": 1, "b": [True]}]
    assert json.loads(lines[2]) == [[5], {}]
    assert lines[3].startswith("!JSONDecodeError: ")
    assert json.loads(lines[4]) == [["s"], {}]


def test_jsonl_with_json_shows_the_parsed_input_and_a_bad_line_is_invalid():
    proc = run_map("--jsonl", "--json", "-j", "2", "cli_functions:show", stdin=JSONL_INPUT)
    assert proc.rc == 1, proc.err
    lines = [json.loads(line) for line in proc.out.splitlines()]
    assert [line["seq"] for line in lines] == [1, 2, 3, 4, 5]
    assert lines[0]["input"] == [1, 2] and lines[0]["ok"] is True
    assert json.loads(lines[0]["value"]) == [[1, 2], {}]
    assert lines[1]["input"] == {"a": 1, "b": [True]}
    assert lines[2]["input"] == 5
    bad = lines[3]
    assert bad["ok"] is False and bad["input"] == "not json"
    assert bad["error"]["kind"] == "invalid"
    assert bad["error"]["type"] == "JSONDecodeError"
    assert lines[4]["input"] == "s" and lines[4]["ok"] is True


# -- order -----------------------------------------------------------------------------------

def test_output_is_in_input_order_even_when_an_earlier_input_is_slower(command, tmp_path):
    cmd = command("-j", "2", "cli_functions:gate", "slow", "fast", env=env_for(tmp_path))
    # The command has taken the fast input's result (it shows what the input printed when
    # it does) while the slow one still waits: only then is the slow one let go.
    assert wait_until(lambda: "printed fast" in cmd.stderr(), 30), cmd.stderr()
    (tmp_path / "release").touch()
    assert cmd.rest() == b"slow\nfast\n"
    assert cmd.wait(30)[0] == 0, cmd.stderr()


def test_unordered_prints_in_completion_order(command, tmp_path):
    cmd = command("-j", "2", "--unordered", "cli_functions:gate", "slow", "fast",
                  env=env_for(tmp_path))
    assert cmd.read_line(30) == b"fast\n"      # while the slow one still waits
    (tmp_path / "release").touch()
    assert cmd.rest() == b"slow\n"
    assert cmd.wait(30)[0] == 0, cmd.stderr()


# -- output ----------------------------------------------------------------------------------

def test_stdout_holds_only_results_what_the_function_prints_goes_to_stderr():
    proc = run_map("-j", "2", "cli_functions:print_everywhere", "a", "b", "c")
    assert proc.rc == 0, proc.err
    assert proc.out == "result a\nresult b\nresult c\n"
    for text in "abc":
        for route in ("print", "stderr", "fd1", "child"):
            assert f"{route} {text}" in proc.err, (route, text, proc.err)


def test_a_failed_input_line_starts_with_a_bang():
    proc = run_map("-j", "2", "builtins:int", "--", "7", "x", "-2")
    assert proc.rc == 1
    assert proc.out == "7\n!ValueError: invalid literal for int() with base 10: 'x'\n-2\n"
    assert "input 2 ('x') failed: ValueError" in proc.err


def test_results_are_escaped_to_one_line_each():
    proc = run_map("-j", "2", "cli_functions:special", "none", "newline", "cr", "bang",
                   "set", "unpicklable", "dict")
    assert proc.rc == 0, proc.err
    assert proc.out.split("\n") == ["", "two\\nlines", "a\\rb", "\\!bang", "{1}",
                                    "an unpicklable thing", "{'k': [1, 2]}", ""]


def test_tag_prefixes_the_input_and_a_tab():
    proc = run_map("-j", "2", "--tag", "builtins:len", "a", "bbb", "x\ty")
    assert proc.rc == 0, proc.err
    assert proc.out == "a\t1\nbbb\t3\nx\\ty\t3\n"


def test_tag_also_prefixes_failures_and_what_the_function_prints():
    proc = run_map("-j", "2", "--tag", "cli_functions:print_everywhere", "a")
    assert proc.rc == 0, proc.err
    assert proc.out == "a\tresult a\n"
    assert "a\tprint a" in proc.err.splitlines()
    proc = run_map("-j", "2", "--tag", "builtins:int", "x")
    assert proc.out == "x\t!ValueError: invalid literal for int() with base 10: 'x'\n"


def test_json_lines_for_results_and_failures():
    proc = run_map("-j", "2", "--json", "builtins:int", "7", "x")
    assert proc.rc == 1
    first, second = [json.loads(line) for line in proc.out.splitlines()]
    assert first == {"seq": 1, "input": "7", "ok": True, "value": 7}
    assert second["seq"] == 2 and second["input"] == "x" and second["ok"] is False
    assert set(second) == {"seq", "input", "ok", "error"}
    error = second["error"]
    assert error["type"] == "ValueError" and error["kind"] == "error"
    assert "invalid literal for int()" in error["message"]


def test_the_type_of_a_failure_is_said_once_its_message_alone_beside_it(tmp_path):
    """--json's "message" is str(exc), the type is in "type" only; the job log's Error is
    the type; the plain line and standard error read as Python shows an exception."""
    log = tmp_path / "log"
    proc = run_map("-j", "2", "--json", "--joblog", str(log), "cli_functions:act",
                   "fail49", "exit3")
    assert proc.rc == 2, proc.err
    raised, died = [json.loads(line)["error"] for line in proc.out.splitlines()]
    assert raised["type"] == "ValueError" and raised["message"] == "failed on fail49"
    assert died["type"] == "WorkerDied" and died["message"].startswith("worker pid ")
    assert "WorkerDied" not in died["message"]
    assert "pool map: input 1 ('fail49') failed: ValueError: failed on fail49" in proc.err
    _, entries = read_joblog(log)
    assert [entries[seq][8] for seq in (1, 2)] == ["ValueError", "WorkerDied"]
    proc = run_map("-j", "2", "cli_functions:act", "fail49")
    assert proc.out == "!ValueError: failed on fail49\n"


def test_json_values_json_cannot_hold_are_their_repr():
    proc = run_map("-j", "2", "--json", "cli_functions:special", "none", "set",
                   "unpicklable", "dict", "newline", "nan")
    assert proc.rc == 0, proc.err
    values = [json.loads(line, parse_constant=_no_constants)["value"]
              for line in proc.out.splitlines()]
    assert values == [None, "{1}", "Unpicklable()", {"k": [1, 2]}, "two\nlines",
                      {"ratio": "nan", "ok": [1.5, "-inf"]}]


def _no_constants(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


# -- --parse ---------------------------------------------------------------------------------

PARSE_INPUT = "1\n x \n-2\n\n"


@pytest.mark.parametrize("kind, values", [
    ("str", ["1", " x ", "-2", ""]),
    ("int", [1, None, -2, None]),
    ("float", [1.0, None, -2.0, None]),
    ("json", [1, None, -2, None]),
    ("literal", [1, None, -2, None]),
])
def test_parse_passes_each_input_as_its_kind(kind, values):
    proc = run_map("--parse", kind, "--json", "-j", "2", "cli_functions:show",
                   stdin=PARSE_INPUT)
    lines = [json.loads(line) for line in proc.out.splitlines()]
    assert [line["seq"] for line in lines] == [1, 2, 3, 4]
    got = [json.loads(line["value"])[0][0] if line["ok"] else None for line in lines]
    assert got == values
    assert proc.rc == values.count(None), proc.err


def test_an_input_that_does_not_parse_fails_alone_and_says_where_and_why(tmp_path):
    log = tmp_path / "log"
    proc = run_map("--parse", "int", "--joblog", str(log), "-j", "2", "math:factorial",
                   stdin="3\n4\nx\n5\n")
    assert proc.rc == 1, proc.err
    assert proc.out == "6\n24\n!ValueError: cannot parse 'x' as int\n120\n"
    assert "pool map: input 3: cannot parse 'x' as int\n" in proc.err
    _, entries = read_joblog(log)
    assert [entries[3][i] for i in (3, 8, 9)] == ["invalid", "ValueError", "x"]
    assert [entries[seq][3] for seq in (1, 2, 4)] == ["ok", "ok", "ok"]

    proc = run_map("--parse", "json", "--json", "builtins:len", stdin='[1]\n{"a\n')
    assert proc.rc == 1, proc.err
    ok, bad = [json.loads(line) for line in proc.out.splitlines()]
    assert ok["input"] == [1] and ok["value"] == 1
    assert bad["input"] == '{"a' and bad["error"] == {
        "type": "JSONDecodeError", "kind": "invalid",
        "message": "cannot parse '{\"a' as JSON: Unterminated string starting at column 2"}


def test_parse_and_jsonl_are_a_usage_error():
    proc = run_map("--parse", "int", "--jsonl", "builtins:len", stdin="1\n")
    assert proc.rc == 255 and "--parse and --jsonl" in proc.err and proc.out == ""


def _examples(help_text: str) -> list[str]:
    """The example commands at the end of a --help."""
    section = help_text.partition("\nexamples:\n")[2]
    return [line.strip() for line in section.splitlines() if line.startswith("  ")]


def _self_contained(example: str) -> bool:
    """Whether an example needs nothing of the reader's: no script (./), no input file
    (-a), and only programs found on PATH."""
    if "./" in example or " -a " in example:
        return False
    for stage in example.split("|"):
        words = shlex.split(stage)
        program = words[0]
        if words[:4] == ["python", "-m", "pool", "run"] and words[4] not in ("-m", "-c"):
            program = words[4]
        if program != "python" and shutil.which(program) is None:
            return False
    return True


@pytest.mark.timeout(200)
def test_every_self_contained_example_of_the_help_runs(tmp_path):
    """Each example of map's and run's --help that needs nothing of the reader's runs as
    written, in a shell, and succeeds: a new user's first try works."""
    (tmp_path / "src").mkdir()   # what ``run -m compileall ... src/`` compiles
    (tmp_path / "src" / "module.py").write_text("x = 1\n")
    examples = []
    for command in (["map", "--help"], ["run", "--help"], ["--help"], ["demo", "--help"]):
        proc = run(*command)
        assert proc.rc == 0, proc.err
        examples += [e for e in _examples(proc.out) if _self_contained(e)]
    assert len(examples) >= 3, examples
    bin_dir = tmp_path / "bin"     # "python" is the Python under test
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for example in examples:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", example], cwd=tmp_path,
                              env=env, capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, (example, proc.stderr.decode())
        assert proc.stdout, example


# -- worker death ----------------------------------------------------------------------------

def test_a_worker_death_fails_only_its_input():
    proc = run_map("-j", "2", "cli_functions:act", "a", "exit3", "b", "segv", "c", "d")
    assert proc.rc == 2, proc.err
    lines = proc.out.splitlines()
    assert len(lines) == 6
    assert [lines[i] for i in (0, 2, 4, 5)] == ["a", "b", "c", "d"]
    assert lines[1].startswith("!WorkerDied: ") and "exit code 3" in lines[1]
    assert lines[3].startswith("!WorkerDied: ") and "SIGSEGV" in lines[3]


def test_a_worker_death_in_json():
    proc = run_map("-j", "2", "--json", "cli_functions:act", "a", "exit3", "segv")
    assert proc.rc == 2, proc.err
    ok, exited, segfaulted = [json.loads(line) for line in proc.out.splitlines()]
    assert ok["ok"] is True and ok["value"] == "a"
    assert exited["ok"] is False and segfaulted["ok"] is False
    assert exited["error"]["kind"] == "died" and exited["error"]["type"] == "WorkerDied"
    assert exited["error"]["exitcode"] == 3
    assert segfaulted["error"]["kind"] == "died" and segfaulted["error"]["signal"] == "SIGSEGV"
    assert "exitcode" not in segfaulted["error"]         # a signal's death has none


def test_system_exit_in_the_function_fails_its_input_not_the_worker():
    proc = run_map("-j", "2", "sys:exit", "3", "4")
    assert proc.rc == 2, proc.err
    assert proc.out == "!SystemExit: 3\n!SystemExit: 4\n"


# -- progress --------------------------------------------------------------------------------

def test_progress_off_a_terminal_ends_with_a_summary_line():
    proc = run_map("-j", "2", "--progress", "builtins:int", "1", "2", "x")
    assert proc.rc == 1
    assert proc.out == "1\n2\n!ValueError: invalid literal for int() with base 10: 'x'\n"
    summary = [line for line in proc.err.splitlines()
               if re.fullmatch(r"2 ok, 1 failed, \d+\.\d s", line)]
    assert len(summary) == 1, proc.err
    assert "\r" not in proc.err


def test_progress_on_a_terminal_draws_a_bar(tmp_path):
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([*MAP, "-j", "2", "--progress", "cli_functions:gate",
                                 "slow", "fast"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=slave, cwd=str(TESTS_DIR),
                                env=env_for(tmp_path))
    finally:
        os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"1/2 done" not in seen:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([master], [], [], left)[0], seen
            seen += os.read(master, 4096)
        (tmp_path / "release").touch()
        out, _ = proc.communicate(timeout=30)
        while select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:     # EIO: every writer is gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(master)
    assert proc.returncode == 0
    assert out == b"slow\nfast\n"
    text = seen.decode()
    assert "\r" in text and "[##########..........] 1/2 done" in text
    assert re.search(r"2 ok, 0 failed, \d+\.\d s", text), text


# -- failures --------------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_timeout_fails_the_stuck_input_with_its_stack():
    proc = run_map("-j", "2", "--timeout", "1", "cli_functions:nap", "60", "0", "0.5")
    assert proc.seconds < QUICK
    assert proc.rc == 1, proc.err
    lines = proc.out.splitlines()
    assert lines[0].startswith("!TaskTimeout"), proc.out
    assert lines[1:] == ["0", "0.5"]
    assert "cli_functions.py" in proc.err and "in nap" in proc.err, proc.err


def test_retries_run_a_failed_input_again(tmp_path):
    log = tmp_path / "log"
    proc = run_map("-j", "2", "--retries", "2", "--joblog", str(log), "cli_functions:flaky",
                   "a", "b", "c", env=env_for(tmp_path))
    assert (proc.rc, proc.out) == (0, "a\nb\nc\n"), proc.err
    assert "retrying" in proc.err
    _, entries = read_joblog(log)
    assert [entries[seq][7] for seq in (1, 2, 3)] == ["2", "2", "2"]   # Attempts
    assert {entries[seq][3] for seq in (1, 2, 3)} == {"ok"}


def test_retry_on_died_does_not_retry_an_exception(tmp_path):
    proc = run_map("-j", "2", "--retries", "2", "--retry-on", "died", "cli_functions:flaky",
                   "a", "b", env=env_for(tmp_path))
    assert proc.rc == 2
    assert proc.out == "!RuntimeError: first attempt at a\n!RuntimeError: first attempt at b\n"
    assert "retrying" not in proc.err


def test_retries_run_an_input_again_after_its_worker_died(tmp_path):
    proc = run_map("-j", "2", "--retries", "1", "cli_functions:flaky_death", "a", "b",
                   env=env_for(tmp_path))
    assert (proc.rc, proc.out) == (0, "a\nb\n"), proc.err
    assert "retrying" in proc.err and "WorkerDied" in proc.err
    proc = run_map("-j", "2", "--retries", "1", "--retry-on", "error,timeout",
                   "cli_functions:flaky_death", "c", env=env_for(tmp_path))
    assert proc.rc == 1 and proc.out.startswith("!WorkerDied"), proc.err


LATER = [f"later{i}" for i in range(1, 41)]
# With -j 2, at most 4 chunks per worker are handed to the pool ahead (and those may run
# even though the run halts): the inputs beyond them must never run.
NEVER = set(LATER[15:])


@pytest.mark.timeout(90)
def test_halt_now_stops_the_running_inputs_and_starts_nothing_more(command, tmp_path):
    cmd = command("-j", "2", "--halt", "now,fail=1", "cli_functions:act", "sleep60",
                  "failwhen:sleep60", *LATER, env=env_for(tmp_path))
    rc, seconds = cmd.wait(QUICK)
    out = cmd.rest().decode()
    assert rc == 1, cmd.stderr()
    assert seconds < QUICK
    assert "!ValueError: failed on failwhen:sleep60" in out.splitlines()
    assert "sleep60" not in out.splitlines()       # stopped: no line
    assert "halting (now)" in cmd.stderr()
    assert not process_exists(pid_in(tmp_path / "pid-sleep60"))
    assert cmd.session_left() == []
    assert not NEVER & set(ran(tmp_path))


@pytest.mark.timeout(90)
def test_halt_soon_lets_the_running_input_finish_and_starts_nothing_more(command, tmp_path):
    cmd = command("-j", "2", "--halt", "soon,fail=1", "cli_functions:act", "sleep2",
                  "failwhen:sleep2", *LATER, env=env_for(tmp_path))
    rc, seconds = cmd.wait(QUICK)
    out = cmd.rest().decode().splitlines()
    assert rc == 1, cmd.stderr()
    assert out[:2] == ["sleep2", "!ValueError: failed on failwhen:sleep2"]
    assert "halting (soon)" in cmd.stderr()
    assert cmd.session_left() == []
    assert not NEVER & set(ran(tmp_path))
    assert not NEVER & set(out)


@pytest.mark.timeout(90)
def test_after_a_halt_input_that_keeps_coming_is_not_run(command, tmp_path):
    cmd = command("-j", "2", "--halt", "soon,fail=1", "cli_functions:act",
                  stdin=subprocess.PIPE, env=env_for(tmp_path))
    cmd.proc.stdin.write(b"hold\nfailwhen:hold\n")
    cmd.proc.stdin.flush()
    assert wait_until(lambda: "halting (soon)" in cmd.stderr(), 30), cmd.stderr()
    try:
        cmd.proc.stdin.write(b"after1\nafter2\n")
        cmd.proc.stdin.close()
    except BrokenPipeError:
        pass
    (tmp_path / "release").touch()
    rc, _ = cmd.wait(QUICK)
    assert rc == 1, cmd.stderr()
    assert cmd.rest().decode().splitlines() == ["hold", "!ValueError: failed on failwhen:hold"]
    assert sorted(ran(tmp_path)) == ["failwhen:hold", "hold"]


def test_halt_by_percent_waits_for_ten_finished_inputs(tmp_path):
    # Five inputs, all failing: 100%, but fewer than 10 finished prove nothing.
    proc = run_map("-j", "2", "--halt", "now,fail=50%", "cli_functions:act",
                   *[f"fail{i}" for i in range(5)])
    assert proc.rc == 5 and "halting" not in proc.err
    assert proc.out.count("!ValueError") == 5
    proc = run_map("-j", "2", "--halt", "now,fail=50%", "cli_functions:act",
                   *[f"fail{i}" for i in range(60)], env=env_for(tmp_path))
    assert "halting (now)" in proc.err
    assert 10 <= proc.rc < 60, proc.err
    assert proc.out.count("!ValueError") == proc.rc
    assert len(ran(tmp_path)) < 60


# -- the job log -----------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_joblog_has_a_line_per_input_with_its_outcome(tmp_path):
    log = tmp_path / "log"
    proc = run_map("-j", "2", "--timeout", "1", "--joblog", str(log), "cli_functions:act",
                   "a", "fail", "exit3", "segv", "sleep60", "tab\there", env=env_for(tmp_path))
    assert proc.seconds < QUICK
    assert proc.rc == 4, proc.err
    lines, entries = read_joblog(log)
    assert lines[0] == JOBLOG_HEADER
    assert len(lines) == 7 and sorted(entries) == [1, 2, 3, 4, 5, 6]
    for fields in entries.values():
        float(fields[1]), float(fields[2])      # Start, Runtime
        assert fields[6].isdigit() and fields[7] == "1"       # Pid, Attempts
    # Outcome, Exitcode, Signal, ..., Error, Input
    columns = lambda seq: [entries[seq][i] for i in (3, 4, 5, 8, 9)]  # noqa: E731
    assert columns(1) == ["ok", "0", "-", "-", "a"]
    assert columns(2) == ["error", "1", "-", "ValueError", "fail"]
    assert columns(3) == ["died", "3", "-", "WorkerDied", "exit3"]
    assert columns(4) == ["died", "-", "SIGSEGV", "WorkerDied", "segv"]   # (no exit code)
    assert [columns(5)[i] for i in (0, 2, 3, 4)] == ["timeout", "SIGKILL", "TaskTimeout",
                                                     "sleep60"]
    assert columns(6) == ["ok", "0", "-", "-", "tab\\there"]
    # The timed-out input's Pid is the worker that ran it.
    assert entries[5][6] == (tmp_path / "pid-sleep60").read_text()


INTERRUPTED = ["sleep60", "failwhen:sleep60", *LATER[:20]]


def interrupted_run(tmp_path: Path, command) -> tuple[Path, Path, dict[int, list[str]]]:
    """A run over INTERRUPTED halted by its first failure; its input file and job log,
    with what the log says."""
    inputs = tmp_path / "inputs"
    inputs.write_text("".join(line + "\n" for line in INTERRUPTED))
    log = tmp_path / "log"
    first = tmp_path / "first"
    first.mkdir()
    cmd = command("-j", "2", "--halt", "now,fail=1", "--joblog", str(log),
                  "cli_functions:act", "-a", str(inputs), env=env_for(first))
    assert cmd.wait(QUICK)[0] == 1, cmd.stderr()
    _, entries = read_joblog(log)
    assert 1 not in entries                           # sleep60 was stopped: not logged
    assert entries[2][3] == "error"
    assert len(entries) < len(INTERRUPTED)
    return inputs, log, entries


@pytest.mark.timeout(90)
def test_resume_runs_exactly_the_inputs_the_log_lacks(tmp_path, command):
    inputs, log, entries = interrupted_run(tmp_path, command)
    second = tmp_path / "second"
    second.mkdir()
    proc = run_map("-j", "2", "--joblog", str(log), "--resume", "cli_functions:act",
                   "-a", str(inputs), env=env_for(second, CLI_TEST_CALM="1"))
    assert proc.rc == 0, proc.err
    missing = [text for seq, text in enumerate(INTERRUPTED, 1) if seq not in entries]
    assert sorted(ran(second)) == sorted(missing)
    assert "failwhen:sleep60" not in ran(second)
    assert proc.out.splitlines() == missing          # lines only for what ran, in order
    lines, after = read_joblog(log)
    assert lines.count(JOBLOG_HEADER) == 1
    assert sorted(after) == list(range(1, len(INTERRUPTED) + 1))


@pytest.mark.timeout(90)
def test_resume_failed_runs_the_failed_and_the_missing_inputs(tmp_path, command):
    inputs, log, entries = interrupted_run(tmp_path, command)
    second = tmp_path / "second"
    second.mkdir()
    proc = run_map("-j", "2", "--joblog", str(log), "--resume-failed", "cli_functions:act",
                   "-a", str(inputs), env=env_for(second, CLI_TEST_CALM="1"))
    assert proc.rc == 0, proc.err
    wanted = [text for seq, text in enumerate(INTERRUPTED, 1)
              if seq not in entries or entries[seq][3] != "ok"]
    assert "failwhen:sleep60" in wanted
    assert sorted(ran(second)) == sorted(wanted)


@pytest.mark.timeout(90)
def test_resume_after_ctrl_c_runs_what_was_stopped(tmp_path, command):
    log = tmp_path / "log"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    inputs = ["a", "b", "sleep60"]
    cmd = command("-j", "2", "--joblog", str(log), "cli_functions:act", *inputs,
                  env=env_for(first))
    pid_in(first / "pid-sleep60")
    assert wait_until(lambda: len(read_joblog(log)[1]) == 2, 30), log.read_text()
    os.kill(cmd.proc.pid, signal.SIGINT)
    assert cmd.wait(QUICK)[0] == -signal.SIGINT, cmd.stderr()
    assert sorted(read_joblog(log)[1]) == [1, 2]       # the stopped input is not logged
    proc = run_map("-j", "2", "--joblog", str(log), "--resume", "cli_functions:act", *inputs,
                   env=env_for(second, CLI_TEST_CALM="1"))
    assert (proc.rc, proc.out) == (0, "sleep60\n"), proc.err
    assert ran(second) == ["sleep60"]
    assert sorted(read_joblog(log)[1]) == [1, 2, 3]


def test_resume_with_a_log_of_other_inputs_is_refused(tmp_path):
    log = tmp_path / "log"
    assert run_map("-j", "2", "--joblog", str(log), "builtins:len", "a", "b").rc == 0
    proc = run_map("-j", "2", "--joblog", str(log), "--resume", "cli_functions:act",
                   "c", "d", "e", env=env_for(tmp_path))
    assert proc.rc == 255
    assert "other inputs" in proc.err and "Traceback" not in proc.err
    assert proc.out == ""


def test_resume_from_a_log_not_written_yet_runs_everything(tmp_path):
    log = tmp_path / "log"        # a retry loop's first turn: `until ... --resume; do :; done`
    proc = run_map("-j", "2", "--joblog", str(log), "--resume-failed", "builtins:len", "a",
                   "bb")
    assert (proc.rc, proc.out) == (0, "1\n2\n"), proc.err
    lines, entries = read_joblog(log)
    assert lines.count(JOBLOG_HEADER) == 1 and sorted(entries) == [1, 2]


def test_resume_needs_a_joblog():
    proc = run_map("--resume", "builtins:len", "a")
    assert proc.rc == 255 and len(usage_error_lines(proc.err)) == 1
    assert "Traceback" not in proc.err


def test_resume_from_a_file_that_is_not_a_job_log_is_refused(tmp_path):
    log = tmp_path / "log"
    log.write_text("hello\nworld\n")
    proc = run_map("--joblog", str(log), "--resume", "builtins:len", "a")
    assert proc.rc == 255 and "not a job log" in proc.err and "Traceback" not in proc.err
    assert log.read_text() == "hello\nworld\n"


# -- exit statuses ---------------------------------------------------------------------------

def test_exit_status_counts_the_failed_inputs():
    assert run_map("-j", "2", "cli_functions:fail_odd", "2", "4").rc == 0
    proc = run_map("-j", "2", "cli_functions:fail_odd", *map(str, range(1, 7)))
    assert proc.rc == 3
    assert proc.out.splitlines() == ["!ValueError: odd: 1", "2", "!ValueError: odd: 3", "4",
                                     "!ValueError: odd: 5", "6"]


def test_more_than_100_failed_inputs_exit_101():
    proc = run_map("-j", "2", "builtins:int", *["x"] * 150)
    assert proc.rc == 101
    assert proc.out.count("!ValueError") == 150


@pytest.mark.parametrize("args", [
    ["--bogus", "builtins:len", "a"],
    ["-j", "0", "builtins:len", "a"],
    ["-j", "x", "builtins:len", "a"],
    ["--timeout", "-1", "builtins:len", "a"],
    ["--timeout", "0", "builtins:len", "a"],
    ["--halt", "bogus", "builtins:len", "a"],
    ["--halt", "now,fail=0", "builtins:len", "a"],
    ["--retry-on", "nonsense", "builtins:len", "a"],
    ["--retries", "-1", "builtins:len", "a"],
    ["no_such_module:thing", "a"],
    ["builtins:no_such_function", "a"],
    ["os:sep", "a"],
    ["len", "a"],
    ["./no_such_script.py:f", "a"],
    ["builtins:len", "-a", "/no/such/file"],
    ["--joblog", "/no/such/dir/log", "builtins:len", "a"],
    ["--joblog", "log", "--resume", "--resume-failed", "builtins:len", "a"],
    ["--start-method", "bogus", "builtins:len", "a"],
    [],
], ids=lambda args: " ".join(args) or "nothing")
def test_usage_errors_exit_255_with_one_error_line(args):
    proc = run_map(*args)
    assert proc.rc == 255, proc.err
    assert len(usage_error_lines(proc.err)) == 1, proc.err
    assert "Traceback" not in proc.err
    assert proc.out == ""


def test_a_script_that_fails_to_import_is_a_usage_error(tmp_path):
    (tmp_path / "broken_script.py").write_text("raise RuntimeError('nope')\n")
    proc = run_map(f"{tmp_path}/broken_script.py:f", "a")
    assert proc.rc == 255 and "Traceback" not in proc.err
    assert len(usage_error_lines(proc.err)) == 1 and "nope" in proc.err


@pytest.mark.parametrize("source, message, where", [
    ("import json\nx = 1\ny = undefined_name\n",
     "NameError: name 'undefined_name' is not defined",
     ['File "{dir}/broken.py", line 3, in <module>', "y = undefined_name"]),
    ("def f(s):\n    return s s\n", "SyntaxError: invalid syntax",
     ['File "{dir}/broken.py", line 2', "return s s"]),
    ("import broken_helper\n", "RuntimeError: config missing",
     ['File "{dir}/broken.py", line 1, in <module>', "import broken_helper",
      'File "{dir}/broken_helper.py", line 2, in g', "raise RuntimeError('config missing')"]),
    ("import argparse\nargparse.ArgumentParser().parse_args()\n",
     "SystemExit: 2 (the module exits when it is imported",
     ['File "{dir}/broken.py", line 2, in <module>']),
], ids=["NameError", "SyntaxError", "in a module it imports", "exits"])
def test_a_module_that_raises_at_import_says_where(tmp_path, source, message, where):
    """The file, line and code of the user's frames, below the one error line; none of
    importlib's, pool's or the standard library's."""
    (tmp_path / "broken.py").write_text(source + "def f(s):\n    return s\n")
    (tmp_path / "broken_helper.py").write_text(
        "def g():\n    raise RuntimeError('config missing')\ng()\n")
    for spec in ("broken:f", "./broken.py:f"):
        proc = run_map(spec, "a", cwd=tmp_path)
        assert proc.rc == 255 and proc.out == "", proc.err
        # (The "exits" module's own parser says "error:" too.)
        (error,) = [line for line in usage_error_lines(proc.err) if "pool map" in line]
        assert f"cannot load '{spec}': {message}" in error
        below = proc.err.partition(error)[2]
        for line in where:
            assert line.format(dir=tmp_path) in below, proc.err
        for ours in ("importlib", "_cli", "argparse.py", "Traceback"):
            assert ours not in below, proc.err


@pytest.mark.parametrize("spec, message", [
    ("json:loads:x", "'json:loads:x' is not MODULE:FUNCTION (more than one ':'): give "
                     "module:function (math:factorial), module:obj.attr "
                     "(json:JSONDecoder.decode) or path/to/file.py:function"),
    ("json", "'json' is not MODULE:FUNCTION (no ':'): give module:function"),
    ("json.loads", "(no ':'; did you mean 'json:loads'?)"),
    ("json:", "'json:' is not MODULE:FUNCTION (nothing after ':')"),
    (":loads", "':loads' is not MODULE:FUNCTION (nothing before ':')"),
    ("json:nosuch", "cannot load 'json:nosuch': module 'json' has no attribute 'nosuch'"),
    ("json:lods", "module 'json' has no attribute 'lods' (did you mean 'loads' or 'load'?)"),
    ("json:JSONDecoder.decod",
     "json:JSONDecoder has no attribute 'decod' (did you mean 'decode' or 'raw_decode'?)"),
    ("json:__doc__", "'json:__doc__' is not callable: it is a str"),
    ("json:decoder", "'json:decoder' is not callable: it is a module"),
])
def test_a_malformed_or_wrong_function_says_what_is_wrong(spec, message):
    proc = run_map(spec, "a")
    assert proc.rc == 255 and proc.out == "", proc.err
    (error,) = usage_error_lines(proc.err)
    assert message in error
    assert "No module named" not in error


def test_a_script_in_a_directory_whose_name_holds_a_colon_loads(tmp_path):
    directory = tmp_path / "a:b"
    directory.mkdir()
    (directory / "colon_script.py").write_text("def f(s):\n    return s + '!'\n")
    proc = run_map("./a:b/colon_script.py:f", "x", cwd=tmp_path)
    assert proc.rc == 0 and proc.out == "x!\n", proc.err


def test_help_exits_0_and_explains_the_exit_statuses():
    proc = run_map("--help")
    assert proc.rc == 0
    assert "exit status" in proc.out
    for status in ("101", "130", "141", "255"):
        assert status in proc.out


def test_version():
    proc = run("--version")
    assert proc.rc == 0
    assert proc.out == f"pool {pool.__version__}\n"


# -- pipelines and signals -------------------------------------------------------------------

# Ending at once when the output's reader has gone needs a pipe that polls as an error then
# (Linux); elsewhere, and under POOL_PORTABLE, the run ends at the next line it writes,
# after these tests' 60 s inputs.
needs_reader_gone_poll = pytest.mark.skipif(
    not _platform.POLL_READER_GONE,
    reason="a reader gone is seen at once only on Linux (pool._platform.POLL_READER_GONE)")


@needs_reader_gone_poll
@pytest.mark.timeout(90)
def test_a_closed_output_pipe_ends_the_run_quietly(command, tmp_path):
    """``python -m pool map ... | head -1`` while the later inputs sleep 60 s."""
    cmd = command("-j", "2", "cli_functions:act", "a", "sleep60", "sleep61", "sleep62",
                  env=env_for(tmp_path))
    sleepers = [pid_in(tmp_path / "pid-sleep60"), pid_in(tmp_path / "pid-sleep61")]
    assert cmd.read_line(30) == b"a\n"
    cmd.close_stdout()
    rc, seconds = cmd.wait(QUICK)
    err = cmd.stderr()
    assert rc == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert not any(process_exists(pid) for pid in sleepers)
    assert cmd.session_left() == []


@needs_reader_gone_poll
def test_a_closed_output_pipe_ends_the_run_while_the_input_is_idle(command):
    """``tail -f log | python -m pool map ... | head -1``: the input has nothing more for
    now, and the reader of the output has gone."""
    cmd = command("-j", "2", "builtins:len", stdin=subprocess.PIPE)
    cmd.proc.stdin.write(b"ab\n")
    cmd.proc.stdin.flush()
    assert cmd.read_line(30) == b"2\n"
    cmd.close_stdout()
    rc, _ = cmd.wait(QUICK)
    assert rc == 141
    assert "Traceback" not in cmd.stderr() and "BrokenPipeError" not in cmd.stderr()
    assert cmd.session_left() == []


@needs_reader_gone_poll
def test_a_closed_output_pipe_in_a_shell_pipeline(tmp_path):
    script = (f"{sys.executable} -m pool map -j 2 cli_functions:act a sleep60 sleep61 "
              f"2>{tmp_path}/err | head -1; echo \"status ${{PIPESTATUS[0]}}\"")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=str(TESTS_DIR), env=env_for(tmp_path))
    assert proc.stdout == "a\nstatus 141\n", (proc.stdout, proc.stderr)
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def start_sleepers(command, tmp_path: Path, *options: str) -> tuple[Command, list[int]]:
    """The command with two inputs running and one queued; its temporary files (its own
    and multiprocessing's) go to ``tmp_path / "tmp"``."""
    (tmp_path / "tmp").mkdir()
    cmd = command("-j", "2", *options, "cli_functions:act", "sleep60", "sleep61", "sleep62",
                  env=env_for(tmp_path, TMPDIR=str(tmp_path / "tmp")))
    return cmd, [pid_in(tmp_path / "pid-sleep60"), pid_in(tmp_path / "pid-sleep61")]


def assert_ended_cleanly(cmd: Command, sleepers: list[int], signum: int, words: str) -> None:
    """Ended by ``signum`` itself (so the shell shows 128+N and a calling loop stops), once
    everything was cleaned up, with one line saying so."""
    rc, seconds = cmd.wait(QUICK)
    err = cmd.stderr()
    assert rc == -signum, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], err
    assert cmd.rest() == b""
    assert not any(process_exists(pid) for pid in sleepers)
    assert cmd.session_left() == []


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.timeout(90)
def test_ctrl_c_stops_the_run_by_sigint(command, tmp_path, method):
    cmd, sleepers = start_sleepers(command, tmp_path, "--start-method", method)
    os.kill(cmd.proc.pid, signal.SIGINT)        # the command alone: not its workers
    assert_ended_cleanly(cmd, sleepers, signal.SIGINT, "interrupted")
    assert list((tmp_path / "tmp").iterdir()) == []     # its temporary files removed


@pytest.mark.timeout(90)
def test_two_ctrl_c_in_a_row_still_end_cleanly(command, tmp_path):
    cmd, sleepers = start_sleepers(command, tmp_path)
    os.kill(cmd.proc.pid, signal.SIGINT)
    os.kill(cmd.proc.pid, signal.SIGINT)
    assert_ended_cleanly(cmd, sleepers, signal.SIGINT, "interrupted")


@pytest.mark.timeout(90)
def test_a_second_ctrl_c_during_the_teardown_is_ignored(command, tmp_path):
    # The worker ignores SIGTERM (writing got-term when it comes), so the teardown waits
    # for its grace period before SIGKILL: the second Ctrl-C lands in the teardown.
    cmd = command("-j", "2", "cli_functions:act", "stubborn", "sleep60",
                  env=env_for(tmp_path))
    sleepers = [pid_in(tmp_path / "pid-stubborn"), pid_in(tmp_path / "pid-sleep60")]
    os.kill(cmd.proc.pid, signal.SIGINT)
    assert wait_until((tmp_path / "got-term").exists, 30), cmd.stderr()
    os.kill(cmd.proc.pid, signal.SIGINT)
    assert_ended_cleanly(cmd, sleepers, signal.SIGINT, "interrupted")


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.timeout(90)
def test_sigterm_and_sighup_stop_the_run_with_128_plus_the_signal(command, tmp_path, signum,
                                                                   method):
    # (Under fork the workers start with the command's own handlers: they must still die
    # of the SIGTERM that ends them.)
    cmd, sleepers = start_sleepers(command, tmp_path, "--start-method", method)
    os.kill(cmd.proc.pid, signum)
    assert_ended_cleanly(cmd, sleepers, signum, signum.name)
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.timeout(90)
def test_ctrl_c_while_waiting_for_input(command):
    cmd = command("-j", "2", "builtins:len", stdin=subprocess.PIPE)
    cmd.proc.stdin.write(b"ab\n")
    cmd.proc.stdin.flush()
    assert cmd.read_line(30) == b"2\n"
    os.kill(cmd.proc.pid, signal.SIGINT)
    assert_ended_cleanly(cmd, [], signal.SIGINT, "interrupted")


@pytest.mark.timeout(240)
def test_ctrl_c_at_any_moment_of_a_busy_run_ends_it(tmp_path):
    """A Ctrl-C can land between any two bytecodes of the main thread; none of them may
    leave a lock taken that the teardown then waits on (a threading.Semaphore's Condition
    did: the command hung). Many runs, each interrupted at a different moment."""
    for attempt in range(20):
        producer = subprocess.Popen(["yes", "x" * 50], stdout=subprocess.PIPE)
        try:
            cli = subprocess.Popen([sys.executable, "-m", "pool", "map", "-j", "2",
                                    "builtins:len"], stdin=producer.stdout,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   cwd=str(TESTS_DIR), start_new_session=True)
            producer.stdout.close()
            # Wait for output (the run is busy), then interrupt after a varying delay.
            assert cli.stdout.readline().strip() == b"50"
            threading.Timer(0.03 * attempt, os.kill, (cli.pid, signal.SIGINT)).start()
            drain = threading.Thread(target=cli.stdout.read, daemon=True)
            drain.start()
            try:
                assert cli.wait(timeout=30) == -signal.SIGINT, attempt
            finally:
                if cli.poll() is None:
                    os.killpg(cli.pid, signal.SIGKILL)
                    cli.wait()
            drain.join(10)
            err = cli.stderr.read().decode()
            assert "Traceback" not in err, err
            assert wait_until(lambda: not session_members(cli.pid), 10)
        finally:
            producer.kill()
            producer.wait()
            cli.stdout.close()
            cli.stderr.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.timeout(90)
def test_a_signal_that_lands_as_the_last_input_finishes_still_ends_the_run_by_it(signum,
                                                                                   tmp_path):
    """Every input done, the run ending: a stop signal now is still the user's, and the
    caller (a shell loop, a script) must learn of it. The short shake once saw a Ctrl-C
    whose handler ran just after the last result: the run ended as if done, status 0. A
    fixed delay holds the run where that race was, and the signal comes once it is there."""
    env = dict(os.environ, POOL_SHAKE="at=cli.before_end_pool:3,tell=1",
               PYTHONPATH=str(TESTS_DIR))
    cli = subprocess.Popen([sys.executable, "-m", "pool", "map", "-j", "2", "builtins:len",
                            "ab", "abc"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=str(TESTS_DIR), env=env, start_new_session=True)
    try:
        assert cli.stderr is not None
        told = cli.stderr.readline()   # blocks until the run is in its pause
        assert told == "pool shake: at cli.before_end_pool\n", told
        os.kill(cli.pid, signum)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    assert cli.returncode == -signum, err
    assert out == "2\n3\n"   # what finished is written all the same
    assert "2 ok, 0 failed, 0 not finished" in err and "Traceback" not in err, err
    assert wait_until(lambda: not session_members(cli.pid), 10)


# -- what can go wrong around the run ----------------------------------------------------------

@pytest.mark.parametrize("method", START_METHODS)
def test_what_an_input_printed_before_its_worker_died_is_on_stderr(method):
    proc = run_map("-j", "2", "--start-method", method, "cli_functions:last_words", "segv",
                   "kill", "fine")
    assert proc.rc == 2, proc.err
    lines = proc.out.splitlines()
    assert lines[0].startswith("!WorkerDied") and "SIGSEGV" in lines[0]
    assert lines[1].startswith("!WorkerDied") and "SIGKILL" in lines[1]
    assert lines[2] == "fine"
    for text in ("segv", "kill", "fine"):
        assert f"last words {text}" in proc.err and f"fd words {text}" in proc.err, proc.err
    # The crash report shows the user's frames, not the command's own machinery.
    assert "last_words" in proc.err and "_cli/task.py" not in proc.err, proc.err
    # Each death is told once, with its input: not again by the pool's own log warning.
    assert "that task failed with WorkerDied" not in proc.err, proc.err


def _shell(command: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          timeout=60, cwd=str(TESTS_DIR), **kwargs)


def test_a_closed_standard_error_loses_only_the_messages():
    proc = _shell(f"{sys.executable} -m pool map -j 2 --progress cli_functions:act "
                  f"a fail1 b 2>&-")
    assert proc.returncode == 1
    assert proc.stdout == "a\n!ValueError: failed on fail1\nb\n"


def test_a_closed_standard_output_is_a_usage_error():
    proc = _shell(f"{sys.executable} -m pool map builtins:len a >&-")
    assert proc.returncode == 255
    assert "standard output is closed" in proc.stderr and "Traceback" not in proc.stderr


def test_a_closed_standard_input_is_a_usage_error():
    proc = _shell(f"{sys.executable} -m pool map builtins:len <&-")
    assert proc.returncode == 255
    assert "standard input is closed" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_standard_output_on_a_full_device_exits_255_and_says_why(tmp_path):
    log = tmp_path / "log"
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([*MAP, "-j", "2", "--joblog", str(log), "builtins:len", "a",
                               "bb"], stdout=full, stderr=subprocess.PIPE, timeout=60,
                              cwd=str(TESTS_DIR))
    err = proc.stderr.decode()
    assert proc.returncode == 255, err
    assert "cannot write standard output: No space left on device" in err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    # Nothing reached the output, so nothing is logged as finished: --resume runs it all.
    assert log.read_text().count("\n") == 1, log.read_text()


def test_output_to_a_pipe_closed_before_the_first_line_exits_141_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*MAP, "-j", "2", "builtins:len", "a", "bb"], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=60, cwd=str(TESTS_DIR))
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode == 141, err
    assert err == "", err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_job_log_that_cannot_be_written_is_a_usage_error():
    proc = run_map("--joblog", "/dev/full", "builtins:len", "a")
    assert proc.rc == 255
    assert "cannot write the job log" in proc.err and "Traceback" not in proc.err
    assert proc.out == ""


def test_resume_after_a_run_killed_while_writing_its_log_appends_whole_lines(tmp_path):
    log = tmp_path / "log"
    first = run_map("-j", "1", "--joblog", str(log), "builtins:len", "a", "bb")
    assert first.rc == 0
    log.write_text(log.read_text()[:-3])          # the last entry torn mid-line
    proc = run_map("--joblog", str(log), "--resume", "builtins:len", "a", "bb", "ccc")
    assert proc.rc == 0, proc.err
    assert proc.out == "2\n3\n"                   # the torn entry did not count
    lines, entries = read_joblog(log)             # (every line whole: ten fields)
    assert sorted(entries) == [1, 2, 3]


@pytest.mark.timeout(90)
def test_an_internal_error_stops_the_workers_and_exits_255(tmp_path):
    inject = ("import sys, pool._cli.results as results\n"
              "def broken(*args): raise RuntimeError('injected fault')\n"
              "results.Results.failed_input = broken\n"
              "from pool._cli.main import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    # The fault comes with the failure of an input that fails only once sleep60 runs, so
    # a worker is busy when it comes.
    proc = subprocess.Popen([sys.executable, "-c", inject, "map", "-j", "2",
                             "cli_functions:act", "sleep60", "failwhen:sleep60", "a", "b"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=str(TESTS_DIR),
                            env=env_for(tmp_path), start_new_session=True)
    try:
        sleeper = pid_in(tmp_path / "pid-sleep60")
        out, err = proc.communicate(timeout=QUICK)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    text = err.decode()
    assert proc.returncode == 255, text
    assert "internal error" in text and "RuntimeError: injected fault" in text, text
    assert not process_exists(sleeper)
    assert wait_until(lambda: not session_members(proc.pid), 10)


@pytest.mark.skipif(sys.platform != "linux", reason="reads a pipe's fill level (Linux)")
@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
@pytest.mark.timeout(90)
def test_one_signal_stops_a_run_blocked_writing_to_a_pipe_nobody_reads(tmp_path, stderr_too):
    """Nobody reads the output (``| less`` left open, a stalled consumer) and the pipe is
    full: the main thread is blocked writing; one SIGTERM still ends the run, within the
    time it gives a slow reader to take the last lines."""
    proc = subprocess.Popen([*MAP, "-j", "2", "--unordered", "builtins:str"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_too else subprocess.DEVNULL,
                            cwd=str(TESTS_DIR), start_new_session=True)
    with proc.stdout:                              # 1.6 MB of output: more than a pipe holds
        assert_one_sigterm_ends_it_once_full(proc, b"x" * 4000 + b"\n", 400,
                                             proc.stdout.fileno(), 30)


def assert_one_sigterm_ends_it_once_full(proc: subprocess.Popen, line: bytes, times: int,
                                         pipe: int, seconds: float) -> None:
    """Feeds ``line`` ``times`` to the command's standard input until the pipe read at
    ``pipe`` is full (the command blocks writing it), then sends one SIGTERM: the command
    must die of it promptly, leaving nothing of its session. Kills it in any case."""
    try:
        writer = threading.Thread(target=_feed, args=(proc.stdin, line, times), daemon=True)
        writer.start()
        _fill_history.pop(pipe, None)
        assert wait_until(lambda: _pipe_is_full(pipe), seconds)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(QUICK) == -signal.SIGTERM
        assert wait_until(lambda: not session_members(proc.pid), 10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(90)
def test_ctrl_c_stops_a_calling_shell_loop(tmp_path):
    """The command dies by SIGINT, so bash knows the user interrupted and stops its loop
    (with exit status 130 it would go on to the next turn)."""
    script = (f"for turn in 1 2 3; do {sys.executable} -m pool map -j 2 cli_functions:act "
              f"sleep60; echo after $turn; done")
    shell = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=str(TESTS_DIR), env=env_for(tmp_path),
                             start_new_session=True)
    try:
        pid_in(tmp_path / "pid-sleep60")
        os.killpg(shell.pid, signal.SIGINT)       # as a terminal's Ctrl-C: the whole group
        out, err = shell.communicate(timeout=QUICK)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.communicate()
    assert b"after" not in out, (out, err)
    assert shell.returncode in (-signal.SIGINT, 130), err


@pytest.mark.timeout(90)
def test_nohup_keeps_sighup_ignored(command, tmp_path):
    cmd = command("-j", "2", "cli_functions:act", "sleep1", "a", env=env_for(tmp_path),
                  preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    pid_in(tmp_path / "pid-sleep1")
    os.kill(cmd.proc.pid, signal.SIGHUP)
    rc, _ = cmd.wait(QUICK)
    assert rc == 0, cmd.stderr()
    assert cmd.rest() == b"sleep1\na\n"


def test_what_the_function_module_prints_on_import_goes_to_stderr(tmp_path):
    script = tmp_path / "noisy.py"
    script.write_text("print('loading noisy')\ndef f(text):\n    return text.upper()\n")
    proc = run_map(f"{script}:f", "a", "b")
    assert proc.rc == 0, proc.err
    assert proc.out == "A\nB\n"
    assert "loading noisy" in proc.err


def test_inputs_may_come_before_or_after_options():
    assert run_map("builtins:len", "--unordered", "a", "bb").out in ("1\n2\n", "2\n1\n")
    proc = run_map("builtins:len", "a", "-j", "1", "bb")
    assert (proc.rc, proc.out) == (0, "1\n2\n"), proc.err


def test_tag_with_json_is_a_usage_error():
    proc = run_map("--tag", "--json", "builtins:len", "a")
    assert proc.rc == 255 and "--tag and --json" in proc.err


def _feed(stream, line: bytes, times: int) -> None:
    try:
        for _ in range(times):
            stream.write(line)
        stream.close()
    except OSError:       # the command has gone: close without the buffered rest
        try:
            stream.close()
        except OSError:
            pass


def _pipe_fill(read_end: int) -> tuple[int, int]:
    """(bytes waiting to be read, the pipe's capacity)."""
    import fcntl
    import termios
    waiting = bytearray(4)
    fcntl.ioctl(read_end, termios.FIONREAD, waiting)
    return int.from_bytes(waiting, sys.byteorder), fcntl.fcntl(read_end, 1032)  # F_GETPIPE_SZ


def _pipe_is_full(read_end: int) -> bool:
    """The pipe's writer is blocked: more than half its capacity waits to be read, and no
    more has come for a while. (Not "nearly all": the kernel keeps a pipe in pages, and
    small writes that straddle them leave it full for a writer with 10 KiB or more of its
    64 KiB unused — seen as a flaky test.)"""
    history = _fill_history.setdefault(read_end, [])
    waiting, capacity = _pipe_fill(read_end)
    history.append(waiting)
    recent = history[-10:]
    return len(recent) == 10 and waiting > capacity // 2 and len(set(recent)) == 1


_fill_history: dict[int, list[int]] = {}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.timeout(120)
def test_a_signal_to_the_whole_process_group_fails_no_input(tmp_path, signum):
    """``timeout``, a service manager or a closing terminal signal the whole group: the
    forkserver dies of it too, and every worker then looks dead (exit code 255). The
    running inputs were stopped, not failed: no '!' line, no job-log entry."""
    for attempt in range(5):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        log = directory / "log"
        proc = subprocess.Popen([*MAP, "-j", "2", "--joblog", str(log), "cli_functions:act",
                                 "sleep60", "sleep61", "sleep62"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, cwd=str(TESTS_DIR),
                                env=env_for(directory), start_new_session=True)
        try:
            pid_in(directory / "pid-sleep60")
            pid_in(directory / "pid-sleep61")
            os.killpg(proc.pid, signum)
            out, err = proc.communicate(timeout=QUICK)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        assert proc.returncode == -signum, err
        assert out == b"", (attempt, out, err)
        assert log.read_text().count("\n") == 1, log.read_text()   # the header only
        assert b"0 failed, 3 not finished" in err, err


def test_an_arg_file_that_is_a_directory_is_a_usage_error(tmp_path):
    proc = run_map("-a", str(tmp_path), "builtins:len")
    assert proc.rc == 255
    assert f"cannot read {tmp_path}: it is a directory" in proc.err


def test_a_negative_number_is_refused_with_a_reason():
    proc = run_map("-j", "-3", "builtins:len", "a")
    assert proc.rc == 255 and "negative numbers are not valid values" in proc.err


@pytest.mark.skipif(sys.platform != "linux", reason="reads a pipe's fill level (Linux)")
@pytest.mark.timeout(90)
def test_one_signal_stops_a_run_whose_stderr_nobody_reads(tmp_path):
    """Every input fails (a message each) and nobody reads standard error: one SIGTERM
    still ends the run promptly, however many messages are left to write."""
    proc = subprocess.Popen([*MAP, "-j", "2", "--chunksize", "100", "builtins:int"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=str(TESTS_DIR), start_new_session=True)
    with proc.stderr:
        assert_one_sigterm_ends_it_once_full(proc, b"x\n", 20_000, proc.stderr.fileno(), 30)


@pytest.mark.skipif(sys.platform != "linux", reason="reads a pipe's fill level (Linux)")
@pytest.mark.timeout(90)
def test_one_signal_stops_a_run_whose_job_log_is_a_pipe_nobody_reads(tmp_path):
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # there, but never reading
    try:
        proc = subprocess.Popen([*MAP, "-j", "2", "--chunksize", "100", "--joblog",
                                 str(fifo), "builtins:len"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                cwd=str(TESTS_DIR), start_new_session=True)
        with proc.stderr:
            assert_one_sigterm_ends_it_once_full(proc, b"ab\n", 200_000, reader, 60)
    finally:
        os.close(reader)


def test_with_standard_error_closed_the_import_output_does_not_reach_the_results(tmp_path):
    script = tmp_path / "noisy.py"
    script.write_text("print('loading noisy')\ndef f(text):\n    return text.upper()\n")
    proc = _shell(f"{sys.executable} -m pool map {script}:f a b 2>&-")
    assert (proc.returncode, proc.stdout) == (0, "A\nB\n")

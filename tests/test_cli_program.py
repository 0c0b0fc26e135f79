"""``python -m pool run``: the program runs in the command's own process (exec), with its
process pools on pool there and in the processes it starts with this Python; exit
statuses, signals and errors are the program's, or a shell's where there is no program."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import communicate_or_kill
from pool import _patch
from pool._cli.program import interpreter_options

RUN = [sys.executable, "-m", "pool", "run"]

# A script that says, as JSON, what it is: its pid, argv, whether its pools are pool's,
# and the same for a child of this Python started with subprocess and one started by
# multiprocessing's spawn.
REPORTER = """
import json, multiprocessing, os, subprocess, sys

def patched():
    import concurrent.futures
    return concurrent.futures.ProcessPoolExecutor.__module__ == "pool._patched"

def report_into(queue):
    queue.put(patched())

if __name__ == "__main__":
    child = subprocess.run(
        [sys.executable, "-c", "import concurrent.futures as f; "
         "print(f.ProcessPoolExecutor.__module__)"], capture_output=True, text=True)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=report_into, args=(queue,))
    process.start()
    spawned = queue.get(timeout=60)
    process.join()
    print(json.dumps(dict(pid=os.getpid(), argv=sys.argv[1:], patched=patched(),
                          child=child.stdout.strip() == "pool._patched", spawned=spawned,
                          dev_mode=sys.flags.dev_mode,
                          pythonpath=os.environ.get("PYTHONPATH", ""))))
    sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def start(arguments: list[str], tmp_path: Path, *, prefix: list[str] | None = None,
          **environment: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*(prefix or RUN), *arguments], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            env=dict(os.environ, **environment))


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    return communicate_or_kill(proc, 90)


@pytest.fixture
def reporter(tmp_path: Path) -> Path:
    script = tmp_path / "reporter.py"
    script.write_text(REPORTER)
    return script


def test_a_script_runs_patched_in_the_commands_own_process_with_its_children(
        tmp_path, reporter):
    proc = start([str(reporter), "a", "--flag"], tmp_path, EXIT_WITH="7",
                 PYTHONPATH="/users/own/path")
    status, out, err = finish(proc)
    facts = json.loads(out)
    assert status == 7, err
    assert facts["pid"] == proc.pid                    # exec: no process in between
    assert facts["argv"] == ["a", "--flag"]
    assert (facts["patched"], facts["child"], facts["spawned"]) == (True, True, True)
    assert facts["pythonpath"].split(os.pathsep)[1:] == ["/users/own/path"]
    assert err == ""


def test_a_module_and_code_run_patched_with_the_interpreters_flags(tmp_path, reporter):
    status, out, err = finish(start(["-m", "reporter", "x"], tmp_path,
                                    prefix=[sys.executable, "-X", "dev", "-m", "pool", "run"]))
    facts = json.loads(out)
    assert status == 0, err
    assert facts["argv"] == ["x"] and facts["patched"] and facts["dev_mode"]
    status, out, err = finish(start(
        ["-c", "import sys, concurrent.futures as f; "
               "print(sys.argv, f.ProcessPoolExecutor.__module__)", "y"], tmp_path))
    assert (status, out) == (0, "['-c', 'y'] pool._patched\n"), err


def test_a_program_on_path_runs_patched_and_so_do_the_pythons_a_shell_program_starts(
        tmp_path, reporter):
    bin_directory = tmp_path / "bin"
    bin_directory.mkdir()
    console_script = bin_directory / "report-tool"   # as pip writes one
    console_script.write_text(f"#!{sys.executable}\n" + REPORTER)
    shell_script = bin_directory / "report-twice.sh"
    shell_script.write_text(f'#!/bin/sh\n"{sys.executable}" "{reporter}" "$@"\n')
    for script in (console_script, shell_script):
        script.chmod(0o755)
    path = f"{bin_directory}{os.pathsep}{os.environ['PATH']}"
    for program in ("report-tool", "report-twice.sh"):
        status, out, err = finish(start([program, "z"], tmp_path, PATH=path))
        facts = json.loads(out)
        assert status == 0, err
        assert (facts["argv"], facts["patched"], facts["child"]) == (["z"], True, True)


def test_a_nested_run_does_not_grow_the_path(tmp_path, reporter):
    status, out, err = finish(start([*RUN, str(reporter)], tmp_path))
    assert status == 0, err
    facts = json.loads(out)
    assert facts["patched"] and len(facts["pythonpath"].split(os.pathsep)) == 1


def test_a_program_on_another_python_is_told_its_pools_are_not_pools(tmp_path):
    # (Another interpreter, as POOL_PATCH sees it: this one with another key. The program
    # is the process of the pid pool run had; exec keeps it, as `exec` in sh does.)
    code = textwrap.dedent("""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", "pass"])   # (a child says nothing)
        import concurrent.futures as f
        print(f.ProcessPoolExecutor.__module__)
        """)
    proc = subprocess.run(
        ["sh", "-c", f'POOL_RUN_PID=$$ exec "{sys.executable}" -c \'{code}\''],
        capture_output=True, text=True, timeout=60, cwd=str(tmp_path), env=dict(
            os.environ, PYTHONPATH=str(Path(_patch.__file__).parent / "_startup"),
            POOL_PATCH="3.0:/another/python"))
    assert proc.stdout == "concurrent.futures.process\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"pool: this program runs on {sys.executable} (Python ")
    assert lines[0].endswith("not on the Python that ran python -m pool run "
                             "(3.0:/another/python): its process pools are not pool's")


def test_the_program_gets_the_signals_a_shell_would_give_it(tmp_path):
    # Python ignores SIGPIPE for itself; a program run by pool run must not inherit that
    # (`yes | head` would end with an error instead of by the signal).
    status, out, err = finish(start(["--", "grep", "^SigIgn:", "/proc/self/status"],
                                    tmp_path))
    assert status == 0, err
    ignored = int(out.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


def test_ctrl_c_reaches_the_program_itself(tmp_path):
    proc = start(["-c", "import time; print('ready', flush=True); time.sleep(60)"], tmp_path)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    status, _, err = finish(proc)
    assert status == -signal.SIGINT and "KeyboardInterrupt" in err


@pytest.mark.parametrize("arguments, status, message", [
    ([], 255, "python -m pool run: error: give a PROGRAM, -m MODULE or -c CODE to run"),
    (["-m"], 255, "python -m pool run: error: -m needs a MODULE"),
    (["--"], 255, "python -m pool run: error: -- needs a PROGRAM"),
    (["--frobnicate"], 255, "unknown option --frobnicate: Python's own options go before "
                            "-m pool (python --frobnicate -m pool run ...); put -- before a "
                            "PROGRAM that starts with -"),
    (["no-such-program-here"], 127, "python -m pool run: no-such-program-here: command "
                                    "not found"),
    (["./not-executable"], 126, "python -m pool run: ./not-executable: Permission denied"),
])
def test_what_cannot_run_is_said_with_a_shells_status(arguments, status, message, tmp_path):
    (tmp_path / "not-executable").write_text("echo hi\n")
    got, out, err = finish(start(arguments, tmp_path))
    assert got == status and out == ""
    assert message in err


def test_help_says_how_and_what_it_cannot_reach(tmp_path):
    status, out, err = finish(start(["--help"], tmp_path))
    assert status == 0 and err == ""
    assert out.startswith("usage: python -m pool run [--] PROGRAM [ARGS ...]")
    assert "multiprocessing.Pool" in out
    listed = subprocess.run([sys.executable, "-m", "pool", "--help"], capture_output=True,
                            text=True, timeout=60, cwd=str(tmp_path))
    assert "run a program with its process pools on pool" in listed.stdout


def test_pythons_own_options_reach_the_program_as_given(tmp_path):
    code = ("import sys, concurrent.futures as f; print(type(sys.stdout.buffer).__name__, "
            "sys.flags.int_max_str_digits, sys.warnoptions, sys.flags.optimize, "
            "f.ProcessPoolExecutor.__module__)")
    environment = dict(os.environ)
    environment.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.run([sys.executable, "-u", "-OO", "-X", "int_max_str_digits=5000",
                           "-Werror::DeprecationWarning", "-m", "pool", "run", "-c", code],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                          env=environment)
    assert proc.stdout == ("FileIO 5000 ['error::DeprecationWarning'] 2 pool._patched\n"), (
        proc.stderr)


def test_options_that_would_keep_the_patch_out_are_left_out_with_a_word(tmp_path):
    code = ("import sys, concurrent.futures as f; print(sys.flags.ignore_environment, "
            "sys.flags.no_user_site, sys.flags.safe_path, f.ProcessPoolExecutor.__module__)")
    proc = subprocess.run([sys.executable, "-I", "-m", "pool", "run", "-c", code],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert proc.stdout == "0 1 True pool._patched\n"
    assert proc.stderr == ("python -m pool run: not passed on to the program: -I (it would "
                           "keep the program from being patched)\n")


@pytest.mark.parametrize("arguments, options, left_out", [
    (["-m", "pool", "run"], [], []),
    (["/venv/bin/pool", "run", "-u"], [], []),               # the console script
    (["-uB", "-X", "dev", "-Wd", "-mpool"], ["-u", "-B", "-X", "dev", "-W", "d"], []),
    (["-OO", "-Xutf8", "-W", "error", "-c", "code", "-u"],
     ["-O", "-O", "-X", "utf8", "-W", "error"], []),
    (["-IS", "-E", "--check-hash-based-pycs", "never", "-m", "pool"],
     ["-s", "-P", "--check-hash-based-pycs", "never"], ["-I", "-S", "-E"]),
])
def test_the_interpreters_options_are_read_back_from_its_command_line(arguments, options,
                                                                      left_out):
    assert interpreter_options(arguments) == (options, left_out)


def test_standard_input_and_a_script_without_a_shebang_run_as_python_and_sh_would(tmp_path):
    proc = subprocess.run([*RUN, "-", "x"], input="import sys, concurrent.futures as f\n"
                          "print(sys.argv, f.ProcessPoolExecutor.__module__)\n",
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert proc.stdout == "['-', 'x'] pool._patched\n", proc.stderr
    script = tmp_path / "no-shebang"
    script.write_text('echo "sh ran $0 with $1"\n')
    script.chmod(0o755)
    proc = subprocess.run([*RUN, str(script), "y"], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))
    assert (proc.returncode, proc.stdout) == (0, f"sh ran {script} with y\n"), proc.stderr


def test_names_are_found_as_a_shell_and_python_would_find_them(tmp_path):
    bin_directory = tmp_path / "bin"
    bin_directory.mkdir()
    tool = bin_directory / "tool"
    tool.write_text("#!/bin/sh\necho tool from PATH\n")
    (bin_directory / "onpath.py").write_text(
        f"#!{sys.executable}\nprint('onpath.py from PATH')\n")
    for script in bin_directory.iterdir():
        script.chmod(0o755)
    (tmp_path / "tool").mkdir()                   # a directory named like it, here
    (tmp_path / "here.py").write_text("print('here.py from here')\n")
    (tmp_path / "bad-interpreter").write_text("#!/no/such/python\n")
    (tmp_path / "bad-interpreter").chmod(0o755)
    path = f"{bin_directory}{os.pathsep}{os.environ['PATH']}"
    for arguments, status, out in [(["tool"], 0, "tool from PATH\n"),
                                   (["here.py"], 0, "here.py from here\n"),
                                   (["onpath.py"], 0, "onpath.py from PATH\n"),
                                   (["./bad-interpreter"], 127, "")]:
        got = finish(start(arguments, tmp_path, PATH=path))
        assert got[:2] == (status, out), got


def test_empty_entries_of_the_pythonpath_stay_the_working_directory(tmp_path):
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "only_here.py").write_text("print('imported from here')\n")
    (tmp_path / "program.py").write_text("import only_here\n")
    proc = start([str(tmp_path / "program.py")], tmp_path / "here",
                 PYTHONPATH=f"{os.pathsep}/no/such/directory")
    assert finish(proc)[:2] == (0, "imported from here\n")

"""``python -m pool run``: runs a program with ``pool.patch()`` in effect in it and in the
Python processes it starts, so that the process pools a library builds for itself (black,
compileall, tqdm, dask) are pool's.

Runs in: the main thread of the command-line process, which it replaces (``exec``): the
program keeps the pid, the standard descriptors, the signals and the exit status, as if it
had been started directly.
Guarantees: the program starts with ``pool/_startup`` first on ``PYTHONPATH`` and
``POOL_PATCH`` naming this interpreter. The start-up hook there (``sitecustomize``)
patches every process of this interpreter that inherits them. If the program itself runs
on another Python, the hook says so on standard error.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
from typing import Sequence

from .console import EXIT_USAGE, flush_quietly, say
from .._patch import ENVIRONMENT_VARIABLE, interpreter_key

USAGE = """\
usage: python -m pool run [--] PROGRAM [ARGS ...]
       python -m pool run -m MODULE [ARGS ...]
       python -m pool run -c CODE [ARGS ...]

Runs a Python program, module or command with concurrent.futures.ProcessPoolExecutor
and multiprocessing.Pool replaced by pool's (pool.patch()), in its own process and in
every process it starts with this Python (this interpreter, in this environment) that
inherits its environment: libraries that build their own process pools get pool's, where
a worker's death fails one task with an explained error instead of breaking the pool or
leaving its result waiting for ever.

PROGRAM is run by this Python, with this Python's own options (python -u -m pool run
...), when it ends in .py, .pyw or .pyz, is a directory, or is - (standard input), as
"python PROGRAM" would; otherwise it is an executable, by its path if it holds a "/",
else found on PATH (a console script such as black, or any program that starts Python).
A bare NAME.py is taken from here if it is here, else from PATH. The program's exit
status is the command's (127: PROGRAM not found, 126: not runnable).

It cannot reach code that imported the class before the patch, processes started with
another Python or with an environment of their own (python -E or -I, env -i), or other
pools (joblib, loky; multiprocessing's ThreadPool is left alone).

examples:
  python -m pool run -m compileall -j 2 src/
  python -m pool run black --workers 2 src/
  python -m pool run ./report.py --input data.csv
"""

EXIT_NOT_FOUND = 127     # as a shell says it
EXIT_NOT_RUNNABLE = 126

# The program's pid, which ``exec`` keeps. The start-up hook compares it with its own to
# know it runs in the program itself, and then says if that is not on this interpreter.
PROGRAM_PID_VARIABLE = "POOL_RUN_PID"

STARTUP_DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "_startup")
_PYTHON_SUFFIXES = (".py", ".pyw", ".pyz")
# Python's own options (its getopt string), for reading them back from sys.orig_argv:
# those that take a value, and those after which the rest is what Python runs.
_WITH_VALUE = "WX"
_LAST = "cm"
# Options that would keep the program from reading the environment or running the
# start-up hook; what each is replaced with (-I stands for -E -P -s).
_NOT_PASSED = {"E": "", "S": "", "I": "sP"}


def run_program(arguments: Sequence[str]) -> int:
    """Replaces this process with the program; returns (an exit status) only if it cannot
    be started."""
    arguments = list(arguments)
    if not arguments:
        return _usage("give a PROGRAM, -m MODULE or -c CODE to run")
    if arguments[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    first = arguments[0]
    if first in ("-m", "-c") or first.startswith(("-m", "-c")) and len(first) > 2:
        option, value = first[:2], first[2:]
        rest = arguments[1:]
        if not value:
            if not rest:
                return _usage(f"{option} needs a {'MODULE' if option == '-m' else 'CODE'}")
            value, rest = rest[0], rest[1:]
        return _exec(sys.executable, [sys.executable, *_flags(), option, value, *rest])
    if first == "--":
        arguments = arguments[1:]
        if not arguments:
            return _usage("-- needs a PROGRAM after it")
    elif first.startswith("-") and first != "-":
        return _usage(f"unknown option {first}: Python's own options go before -m pool "
                      f"(python {first} -m pool run ...); put -- before a PROGRAM that "
                      f"starts with -")
    program, rest = arguments[0], arguments[1:]

    def by_python() -> int:
        return _exec(sys.executable, [sys.executable, *_flags(), program, *rest])

    if program == "-":
        return by_python()
    if os.sep in program:
        if program.endswith(_PYTHON_SUFFIXES) or os.path.isdir(program):
            return by_python()
        return _exec(program, [program, *rest])
    # A bare name: app.py from here, as python takes it; black from PATH, as a shell
    # does. A name that is neither, from wherever it is.
    if os.path.exists(program) and program.endswith(_PYTHON_SUFFIXES):
        return by_python()
    found = shutil.which(program)
    if found is not None:
        return _exec(found, [program, *rest])
    if program.endswith(_PYTHON_SUFFIXES) or os.path.isdir(program):
        return by_python()   # python says what is wrong with it
    say(f"python -m pool run: {program}: command not found")
    return EXIT_NOT_FOUND


def _exec(path: str, argv: list[str]) -> int:
    environment = dict(os.environ)
    # Ours goes first, once: a pool run inside a pool run does not grow the path. The
    # other entries stay as they were, empty ones too: an empty one is the working
    # directory.
    given = environment.get("PYTHONPATH", "")
    others = [entry for entry in given.split(os.pathsep)
              if not entry or os.path.abspath(entry) != STARTUP_DIRECTORY] if given else []
    environment["PYTHONPATH"] = os.pathsep.join([STARTUP_DIRECTORY, *others])
    environment[ENVIRONMENT_VARIABLE] = interpreter_key()
    environment[PROGRAM_PID_VARIABLE] = str(os.getpid())
    for stream in (sys.stdout, sys.stderr):
        flush_quietly(stream)
    # Python ignores SIGPIPE and SIGXFSZ for itself. The program gets their defaults
    # back, as a program started from a shell has them; subprocess restores them too.
    # Handled signals, such as SIGINT, are reset by exec itself. An ignored SIGINT stays
    # ignored, as it should.
    for name in ("SIGPIPE", "SIGXFSZ"):
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    try:
        try:
            os.execve(path, argv, environment)
        except OSError as exc:
            if exc.errno != errno.ENOEXEC or not _is_text(path):
                raise
            # An executable text without "#!": a shell runs it with sh, so this does.
            os.execve("/bin/sh", ["sh", path, *argv[1:]], environment)
    except OSError as exc:
        say(f"python -m pool run: {argv[0]}: {exc.strerror}")
        # As a shell does: 127 when the program or its #! interpreter is not there.
        return EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_NOT_RUNNABLE
    raise AssertionError("execve returned")   # it only returns by raising


def _is_text(path: str) -> bool:
    """Whether the file is text, as a shell checks before it runs one with sh: no NUL
    byte in its first line. A program built for another machine is not text."""
    try:
        with open(path, "rb") as program:
            head = program.read(256)
    except OSError:
        return False
    return b"\0" not in head.split(b"\n", 1)[0]


def _flags() -> list[str]:
    """The options this interpreter was started with, as given (``-u``,
    ``-X int_max_str_digits=...``, ``-W error``), for the program it runs. They are read
    back from ``sys.orig_argv``, up to what it ran (``-m pool``, or the ``pool`` script).
    Those that would keep the patch out are left out, with a word on standard error."""
    flags, left_out = interpreter_options(sys.orig_argv[1:])
    if left_out:
        say(f"python -m pool run: not passed on to the program: {' '.join(left_out)} "
            f"(it would keep the program from being patched)")
    return flags


def interpreter_options(arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """Python's own options at the start of ``arguments`` (a command line after the
    interpreter's name), one per item; and those of ``_NOT_PASSED`` among them."""
    flags: list[str] = []
    left_out: list[str] = []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        index += 1
        if argument == "--check-hash-based-pycs" and index < len(arguments):
            flags += [argument, arguments[index]]
            index += 1
            continue
        if not argument.startswith("-") or argument in ("-", "--") or argument[1] == "-":
            break
        letters = argument[1:]
        for position, letter in enumerate(letters):
            if letter in _LAST:
                return flags, left_out
            if letter in _WITH_VALUE:
                value = letters[position + 1:]
                if not value and index < len(arguments):
                    value = arguments[index]
                    index += 1
                flags += [f"-{letter}", value]
                break
            if letter in _NOT_PASSED:
                left_out.append(f"-{letter}")
                flags += [f"-{kept}" for kept in _NOT_PASSED[letter]]
            else:
                flags.append(f"-{letter}")
    return flags, left_out


def _usage(message: str) -> int:
    say(f"python -m pool run: error: {message}\n(python -m pool run --help shows how)")
    return EXIT_USAGE

"""``python -m pool``: ``demo``; ``map``, which calls a Python function over inputs from
the command line, for shell pipelines; and ``run`` (``program``), which runs a program
with its process pools on pool.

Owns: the standard descriptors, opening the input and the job log, and the exit status.
A run stopped by a signal ends by that signal. ``map``'s options are in ``options``, its
run in ``map_run`` and the modules it names, the exit statuses in ``console``.
Runs in: the main thread of a command-line process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import stat
import sys
from typing import Callable, Sequence

from .. import _compat
from .console import (EXIT_INTERRUPTED, EXIT_MANY_FAILED, EXIT_OK, EXIT_PIPE, EXIT_USAGE,
                      flush_quietly, is_open, say)
from .inputs import counter, read_inputs, records_of, records_of_arguments
from .joblog import Joblog, JoblogError, Resume, read_joblog
from .options import Options, build_parsers
from .map_end import End, RunSummary
from .map_run import Run

def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command and returns its exit status. A run stopped by a signal instead
    ends the process by that signal, once everything is cleaned up, as Python does for
    Ctrl-C. A calling shell then knows the user interrupted, and a shell loop stops too."""
    try:
        status = _command(argv)
    except KeyboardInterrupt:   # before the run took the signals over (importing, opening)
        say("pool: interrupted")
        status = EXIT_INTERRUPTED
    signum = _SIGNAL_OF_STATUS.get(status)
    if signum is not None:
        _die_by(signum)
    return status


# Statuses that stand for a signal. Every other status the command uses is below 128,
# or 141 (a closed output pipe), or 255.
_SIGNAL_OF_STATUS = {128 + signum: signum for signum in
                     (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _command(argv: Sequence[str] | None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["run"]:
        # Before anything else: the program gets the process as it was, closed
        # descriptors included. Everything after PROGRAM is the program's.
        from .program import run_program
        return run_program(arguments[1:])
    closed = _fill_closed_standard_fds()
    command_parser, map_parser = build_parsers()
    if arguments[:1] == ["map"]:
        # Inputs may come before or after options (``map f --tag a b``, ``map f a --tag``).
        return _map(map_parser.parse_intermixed_args(arguments[1:]), closed)
    args = command_parser.parse_args(arguments)
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(start_method=args.start_method)
    return _map(args, closed)


def _fill_closed_standard_fds() -> frozenset[int]:
    """Opens /dev/null on each of descriptors 0, 1 and 2 that the command was started
    without, and returns their numbers. Left closed, a number would go to the next file or
    pipe opened, the pool's own, and what is meant for standard error would go into it."""
    closed = frozenset(fd for fd in (0, 1, 2) if not is_open(fd))
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)   # the workers start with it too
    return closed


def _die_by(signum: int) -> None:
    # What the interpreter's exit would do first: the atexit functions (multiprocessing
    # removes its temporary directory there), and the streams flushed.
    _compat.run_atexit_functions()
    for stream in (sys.stdout, sys.stderr):
        flush_quietly(stream)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})  # if it was blocked, now


def _usage(message: str) -> int:
    say(f"python -m pool map: error: {message}")
    return EXIT_USAGE


def _map(args: argparse.Namespace, closed: frozenset[int]) -> int:
    from .._options import usable_cpu_count

    if args.inputs and args.arg_file:
        return _usage("give inputs as arguments or with -a FILE, not both")
    if (args.resume or args.resume_failed) and not args.joblog:
        return _usage("--resume and --resume-failed need --joblog FILE")
    if args.jsonl and args.parse:
        return _usage("--parse and --jsonl do not go together: --jsonl reads each line as "
                      "JSON arguments, typed already")
    if args.tag and args.json:
        return _usage("--tag and --json do not go together: each JSON object holds its "
                      "input already")
    if 1 in closed:
        return _usage("standard output is closed: there is nowhere to write the results")
    workers = args.workers or usable_cpu_count()
    total: int | Callable[[], int | None] | None
    fd = -1
    if args.inputs:
        records = records_of_arguments(args.inputs)
        total = len(args.inputs)
    else:
        fd = 0
        if args.arg_file and args.arg_file != "-":
            try:
                fd = os.open(args.arg_file, os.O_RDONLY)
            except OSError as exc:
                return _usage(f"cannot read {args.arg_file}: {exc.strerror}")
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                return _usage(f"cannot read {args.arg_file}: it is a directory")
        elif 0 in closed:
            return _usage("standard input is closed: give inputs as arguments or with -a")
        records = records_of(fd, args.null)
        total = counter(fd, args.null, args.jsonl)
    resumed = None
    joblog = None
    try:
        if (args.resume or args.resume_failed) and os.path.exists(args.joblog):
            resumed = read_joblog(args.joblog)
        # Resuming from a log not written yet runs everything: a retry loop's first turn.
        if args.joblog:
            joblog = Joblog.open(args.joblog, append=resumed is not None)
    except JoblogError as exc:
        return _usage(str(exc))
    options = Options(
        function=args.function, workers=workers, chunksize=args.chunksize,
        mp_context=(multiprocessing.get_context(args.start_method)
                    if args.start_method else None),
        as_json=args.json, tag=args.tag, unordered=args.unordered, progress=args.progress,
        timeout=args.timeout, retries=args.retries, retry_on=args.retry_on, halt=args.halt,
        joblog=joblog,
        resume=(Resume(resumed, rerun_failed=args.resume_failed) if resumed is not None
                else None),
        window=args.read_ahead or max(1000, 4 * workers * args.chunksize))
    try:
        inputs = read_inputs(records, args.jsonl, args.parse or "str")
        summary = Run(options, inputs, total, stdout_fd=1,
                      stderr_fd=None if 2 in closed else 2).run()
    finally:
        if joblog is not None:
            joblog.close()
        if fd > 0:
            os.close(fd)
    return _exit_status(summary)


def _exit_status(summary: RunSummary) -> int:
    """The exit status. The run has said on standard error why it ended early."""
    if summary.end is End.SIGNAL:
        return 128 + summary.signum
    if summary.end is End.OUTPUT_CLOSED:
        return EXIT_PIPE
    if summary.end in (End.DONE, End.HALT):
        if summary.failed == 0:
            return EXIT_OK
        return EXIT_MANY_FAILED if summary.failed > 100 else summary.failed
    return EXIT_USAGE   # standard output or the job log failed, bad input, a bug

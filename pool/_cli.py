"""``python -m pool``: the demo, and ``map``, which calls a Python function over inputs from
the command line, for shell pipelines.

Runs in: the main thread of a command-line process. Owns the options, loading the
function, opening the input and the job log, and the exit status; the run itself is
``_cli_run``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import multiprocessing
import os
import re
import signal
import stat
import sys
from typing import Any, Callable, Iterator, NoReturn, Sequence

from . import __version__
from ._cli_inputs import counter, read_inputs, records_of, records_of_arguments
from ._cli_joblog import Joblog, JoblogError, Resume, read_joblog
from ._cli_run import RETRY_KINDS, End, Halt, Options, Outcome, Run

# Exit statuses of ``map`` (GNU parallel's convention, plus the shell's for signals).
EXIT_OK = 0               # every input succeeded
EXIT_MANY_FAILED = 101    # more than 100 inputs failed (1-100: exactly that many failed)
EXIT_USAGE = 255          # bad options, function, input or job log; standard output
                          # failing; an internal error (each explained on standard error)
EXIT_INTERRUPTED = 130    # Ctrl-C (128 + SIGINT)
EXIT_PIPE = 141           # standard output was closed (128 + SIGPIPE), e.g. by `| head`

EXIT_STATUS_HELP = """\
exit status:
  0       every input succeeded
  1-100   that many inputs failed
  101     more than 100 inputs failed
  130     interrupted by Ctrl-C (143: SIGTERM, 129: SIGHUP)
  141     standard output was closed (| head): the run stopped quietly
  255     bad option, function, input or job log, standard output that cannot
          be written, or an internal error (each explained on standard error)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument") and any(
                re.fullmatch(r"-\d+(\.\d*)?", argument) for argument in sys.argv[1:]):
            # (-0 is an option, so argparse takes "-3" for one too, not for a value)
            message += " (negative numbers are not valid values)"
        # (Parsing inputs and options in any order makes argparse name INPUT as required
        # too when the function is missing; it is not.)
        message = message.replace("MODULE:FUNCTION, INPUT", "MODULE:FUNCTION")
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _load_function(spec: str) -> Callable[..., Any]:
    """``MODULE:FUNCTION`` (importable) or ``PATH.py:FUNCTION`` (a script, by its path)."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:FUNCTION or PATH.py:FUNCTION, got {spec!r}")
    try:
        with _stdout_to_stderr():   # standard output is for results only
            if module_name.endswith(".py") or os.sep in module_name:
                target: Any = _import_script(module_name)
            else:
                target = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except argparse.ArgumentTypeError:
        raise
    except Exception as exc:  # the module's own code may raise anything while importing
        raise argparse.ArgumentTypeError(
            f"cannot load {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise argparse.ArgumentTypeError(f"{spec!r} is not callable")
    return target  # type: ignore[no-any-return]


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While the user's module is imported: what it prints goes to standard error."""
    if not (_is_open(1) and _is_open(2)):
        yield
        return
    _flush_quietly(sys.stdout)
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        _flush_quietly(sys.stdout)
        os.dup2(saved, 1)
        os.close(saved)


def _flush_quietly(stream: Any) -> None:
    try:
        if stream is not None:
            stream.flush()
    except Exception:
        pass


def _import_script(path: str) -> Any:
    """Imports a script as the module its file name makes, from its directory, which is put
    first on ``sys.path``: workers started by spawn or forkserver get that path too, so the
    function travels by reference (its globals and its file names in tracebacks intact)."""
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"cannot load {path!r}: no such file")
    directory, filename = os.path.split(os.path.abspath(path))
    name = filename[:-3] if filename.endswith(".py") else filename
    if not name.isidentifier():
        raise argparse.ArgumentTypeError(
            f"cannot load {path!r}: {name!r} is not a valid module name; rename the file")
    sys.path.insert(0, directory)
    module = importlib.import_module(name)
    origin = getattr(module, "__file__", None)
    if origin is None or not os.path.samefile(origin, os.path.join(directory, filename)):
        raise argparse.ArgumentTypeError(
            f"cannot load {path!r}: the module {name!r} is {origin or 'built in'}, not this "
            f"file; rename the file")
    return module


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _retry_kinds(text: str) -> frozenset[str]:
    kinds = frozenset(kind.strip() for kind in text.split(","))
    unknown = kinds - set(RETRY_KINDS)
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(RETRY_KINDS)}, got {text!r}")
    return kinds


def _halt(text: str) -> Halt:
    when, _, condition = text.partition(",")
    key, _, amount = condition.partition("=")
    problem = (f"expected now|soon,fail=N (N at least 1) or now|soon,fail=P% (P above 0, "
               f"at most 100), got {text!r}")
    if when not in ("now", "soon") or key != "fail":
        raise argparse.ArgumentTypeError(problem)
    try:
        if amount.endswith("%"):
            percent = float(amount[:-1])
            if not 0 < percent <= 100:
                raise ValueError
            return Halt(when == "now", None, percent)
        number = int(amount)
        if number < 1:
            raise ValueError
        return Halt(when == "now", number, None)
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command's parser, and its ``map`` subcommand's."""
    parser = _Parser(
        prog="python -m pool",
        description="A process pool where a worker's death fails one task, not the pool.")
    parser.add_argument("--version", action="version", version=f"pool {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = commands.add_parser("demo", help="run a batch where one task segfaults and one "
                               "is SIGKILLed; every other task succeeds")
    demo.add_argument("--start-method", choices=multiprocessing.get_all_start_methods())
    run = commands.add_parser(
        "map", help="call a Python function on each input, in parallel",
        usage="%(prog)s [options] MODULE:FUNCTION [INPUT ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Calls FUNCTION on each input, in a pool of worker processes, and prints one line per
input on standard output, in input order: the result (str(); None prints an empty line;
line breaks inside it as \\n), or for a failed input a line that starts with "!" and
names the error (a result that starts with "!" is printed as "\\!..."; the plain form
is for reading and grep: use --json to recover results exactly). Standard output holds
results only: what the function prints goes to standard error, grouped per input, with
each failure's traceback. A worker that dies (segfault, os._exit, SIGKILL) fails only
its input. An input stopped by --halt now or a signal gets no line (it did not finish).

Inputs are the INPUT arguments, or the lines of FILE (-a) or standard input, read as
the run goes (a pipeline streams). A line is passed as one string argument, without
its line ending (\\n or \\r\\n); a blank line is an input too (the empty string), so
output lines stay aligned with input lines.

Ctrl-C, SIGTERM and SIGHUP stop the run: every worker is ended, the lines of what
finished are written, and one line on standard error says what was left.""",
        epilog=EXIT_STATUS_HELP + """
examples:
  seq 1 100 | python -m pool map math:factorial --unordered
  python -m pool map ./resize.py:resize -a images.txt --progress --joblog run.log
  python -m pool map ./resize.py:resize -a images.txt --joblog run.log --resume-failed
  find . -name '*.json' -print0 | python -m pool map -0 ./check.py:check --tag --halt now,fail=1
""")
    run.add_argument("function", type=_load_function, metavar="MODULE:FUNCTION",
                     help="an importable module's function (os.path:getsize), or a "
                          "script's (./script.py:func)")
    run.add_argument("inputs", nargs="*", metavar="INPUT",
                     help="inputs, each passed as a string (default: lines of standard "
                          "input); put -- before them if one starts with -")
    source = run.add_argument_group("input")
    source.add_argument("-a", "--arg-file", metavar="FILE",
                        help="read the inputs from FILE instead of standard input")
    source.add_argument("-0", "--null", action="store_true",
                        help="inputs are separated by NUL bytes, not lines (find -print0)")
    source.add_argument("--jsonl", action="store_true",
                        help="each line is JSON: a list is the positional arguments, an "
                             "object the keyword arguments, anything else the one argument; "
                             "blank lines are skipped")
    out = run.add_argument_group("output")
    out.add_argument("--unordered", action="store_true",
                     help="print each line as its input finishes (default: input order)")
    out.add_argument("--tag", action="store_true",
                     help="start each line with the input and a tab (also the lines the "
                          "function prints, on standard error)")
    out.add_argument("--json", action="store_true",
                     help='print one JSON object per input: {"seq", "input", "ok": true, '
                          '"value"} or {"seq", "input", "ok": false, "error": {"type", '
                          '"message", "kind", ...}}; a value JSON cannot hold is its repr')
    out.add_argument("--progress", action="store_true",
                     help="show done, failed, rate and ETA on standard error (a bar on a "
                          "terminal, a line every 3 s otherwise), then a summary line")
    fail = run.add_argument_group("failures")
    fail.add_argument("--timeout", type=_seconds, metavar="S",
                      help="stop an input that runs longer than S seconds: it fails with "
                           "the stack it was stuck in (with --chunksize N: N*S per chunk)")
    fail.add_argument("--retries", type=_count, default=0, metavar="N",
                      help="run a failed input up to N more times (see --retry-on)")
    fail.add_argument("--retry-on", type=_retry_kinds, default=frozenset(RETRY_KINDS),
                      metavar="KINDS",
                      help="which failures --retries retries: a comma-separated list of "
                           "died (the worker died), timeout, error (an exception) "
                           "(default: all three)")
    fail.add_argument("--halt", type=_halt, metavar="now|soon,fail=N|P%",
                      help="stop after N failed inputs (or P%% of those finished, once 10 "
                           "have): soon lets running inputs finish, now stops them at once; "
                           "nothing more is started")
    record = run.add_argument_group("job log")
    record.add_argument("--joblog", metavar="FILE",
                        help="write a tab-separated line per finished input: Seq, Start, "
                             "Runtime, Outcome, Exitcode, Signal, Pid, Attempts, Error, Input")
    resume = record.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="with --joblog: skip the inputs the log says finished, run the "
                             "rest (appending to the log)")
    resume.add_argument("--resume-failed", action="store_true",
                        help="with --joblog: skip the inputs the log says succeeded; run the "
                             "failed ones again and the rest")
    tuning = run.add_argument_group("pool")
    tuning.add_argument("-j", "--jobs", "--workers", dest="workers", type=_positive_int,
                        metavar="N", help="worker processes (default: the CPUs available)")
    tuning.add_argument("--chunksize", type=_positive_int, default=1, metavar="N",
                        help="send N inputs per task: one per task runs about 9,000 "
                             "inputs/s on 2 cores, chunks of 100 several times more; a worker "
                             "death or timeout then fails its whole chunk")
    tuning.add_argument("--read-ahead", type=_positive_int, metavar="N",
                        help="inputs read ahead of the output (default: 1000, or 4 per "
                             "worker per chunk if more)")
    tuning.add_argument("--start-method", choices=multiprocessing.get_all_start_methods())
    return parser, run


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns its exit status. A run stopped by a signal ends the
    process by that signal instead (once everything is cleaned up), as Python does for
    Ctrl-C: a calling shell then knows the user interrupted, and a loop stops too."""
    try:
        status = _command(argv)
    except KeyboardInterrupt:   # before the run took the signals over (importing, opening)
        _say("pool: interrupted")
        status = EXIT_INTERRUPTED
    signum = _SIGNAL_OF_STATUS.get(status)
    if signum is not None:
        _die_by(signum)
    return status


# Statuses that stand for a signal (every other status the command uses is below 128,
# 141 for a closed output pipe, or 255).
_SIGNAL_OF_STATUS = {128 + signum: signum for signum in
                     (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _command(argv: Sequence[str] | None) -> int:
    closed = _fill_closed_standard_fds()
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser, map_parser = _parser()
    if arguments[:1] == ["map"]:
        # Inputs may come before or after options (``map f --tag a b``, ``map f a --tag``).
        return _map(map_parser.parse_intermixed_args(arguments[1:]), closed)
    args = parser.parse_args(arguments)
    if args.command == "demo":
        from ._demo import run_demo
        return run_demo(start_method=args.start_method)
    return _map(args, closed)


def _fill_closed_standard_fds() -> frozenset[int]:
    """Descriptors 0, 1 and 2 that the command was started without, now /dev/null: left
    closed, the next file or pipe opened (the pool's own) would take the number, and what
    is meant for standard error would go into it."""
    closed = frozenset(fd for fd in (0, 1, 2) if not _is_open(fd))
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)   # (the workers start with it too)
    return closed


def _die_by(signum: int) -> None:
    # What the interpreter's exit would do first: the atexit functions (multiprocessing
    # removes its temporary directory there), and the streams flushed.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        _flush_quietly(stream)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})  # (if it was blocked: now)


def _say(text: str) -> None:
    """A line on standard error, if there is one to write to."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
    except Exception:
        pass


def _usage(message: str) -> int:
    _say(f"python -m pool map: error: {message}")
    return EXIT_USAGE


def _map(args: argparse.Namespace, closed: frozenset[int]) -> int:
    from ._executor import _cpu_count

    if args.inputs and args.arg_file:
        return _usage("give inputs as arguments or with -a FILE, not both")
    if (args.resume or args.resume_failed) and not args.joblog:
        return _usage("--resume and --resume-failed need --joblog FILE")
    if args.tag and args.json:
        return _usage("--tag and --json do not go together: each JSON object holds its "
                      "input already")
    if 1 in closed:
        return _usage("standard output is closed: there is nowhere to write the results")
    workers = args.workers or _cpu_count()
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
        # (Resuming from a log not written yet runs everything: a retry loop's first turn.)
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
        outcome = Run(options, read_inputs(records, args.jsonl), total, stdout_fd=1,
                      stderr_fd=None if 2 in closed else 2).run()
    finally:
        if joblog is not None:
            joblog.close()
        if fd > 0:
            os.close(fd)
    return _exit_status(outcome)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _exit_status(outcome: Outcome) -> int:
    """The status (the run has said on standard error why it ended early)."""
    if outcome.end is End.SIGNAL:
        return 128 + outcome.signum
    if outcome.end is End.OUTPUT_CLOSED:
        return EXIT_PIPE
    if outcome.end in (End.DONE, End.HALT):
        if outcome.failed == 0:
            return EXIT_OK
        return EXIT_MANY_FAILED if outcome.failed > 100 else outcome.failed
    return EXIT_USAGE   # standard output or the job log failed, bad input, a bug

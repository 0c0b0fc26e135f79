"""``python -m pool``: the demo, and ``map``, which calls a Python function over inputs from
the command line, for shell pipelines.

Runs in: the main thread of a command-line process. Owns the options, loading the
function, opening the input and the job log, and the exit status; the run itself is
``_cli_run``.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import signal
import sys
from typing import Any, Callable, NoReturn, Sequence

from . import __version__
from ._cli_inputs import count, read_inputs, records_of, records_of_arguments
from ._cli_joblog import Joblog, JoblogError, read_joblog
from ._cli_run import RETRY_KINDS, Halt, Options, Outcome, Run, install_signal_handlers

# Exit statuses of ``map`` (GNU parallel's convention, plus the shell's for signals).
EXIT_OK = 0               # every input succeeded
EXIT_MANY_FAILED = 101    # more than 100 inputs failed (1-100: exactly that many failed)
EXIT_USAGE = 255          # bad options, a function or input or job log that cannot be used
EXIT_INTERRUPTED = 130    # Ctrl-C (128 + SIGINT)
EXIT_PIPE = 141           # standard output was closed (128 + SIGPIPE), e.g. by `| head`

EXIT_STATUS_HELP = """\
exit status:
  0       every input succeeded
  1-100   that many inputs failed
  101     more than 100 inputs failed
  130     interrupted by Ctrl-C (143: SIGTERM, 129: SIGHUP)
  141     standard output was closed (| head): the run stopped quietly
  255     usage error: bad option, function, input file or job log
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _load_function(spec: str) -> Callable[..., Any]:
    """``MODULE:FUNCTION`` (importable) or ``PATH.py:FUNCTION`` (a script, by its path)."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:FUNCTION or PATH.py:FUNCTION, got {spec!r}")
    try:
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
    problem = f"expected now|soon,fail=N or now|soon,fail=P%, got {text!r}"
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


def _parser() -> argparse.ArgumentParser:
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Calls FUNCTION on each input, in a pool of worker processes, and prints one line per
input on standard output, in input order: the result (str(); None prints an empty line;
line breaks inside it as \\n), or for a failed input a line that starts with "!" and
names the error (a result that starts with "!" is printed as "\\!..."). Standard output
holds results only: what the function prints goes to standard error, grouped per
input, with each failure's traceback. A worker that dies (segfault, os._exit, SIGKILL)
fails only its input.

Inputs are the INPUT arguments, or the lines of FILE (-a) or standard input, read as
the run goes (a pipeline streams). A line is passed as one string argument, without
its line ending (\\n or \\r\\n); a blank line is an input too (the empty string), so
output lines stay aligned with input lines.""",
        epilog=EXIT_STATUS_HELP + """
examples:
  seq 1 100 | python -m pool map math:factorial --unordered
  python -m pool map ./resize.py:resize -a images.txt --progress --joblog run.log
  python -m pool map ./resize.py:resize -a images.txt --joblog run.log --resume-failed
  find . -name '*.json' -print0 | python -m pool map -0 json_tool:check --tag --halt now,fail=1
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
                        help="send N inputs per task: less overhead for tiny inputs; a "
                             "worker death or timeout then fails its whole chunk")
    tuning.add_argument("--read-ahead", type=_positive_int, metavar="N",
                        help="inputs read ahead of the output (default: 1000, or 4 per "
                             "worker per chunk if more)")
    tuning.add_argument("--start-method", choices=multiprocessing.get_all_start_methods())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except KeyboardInterrupt:   # while importing the function
        sys.stderr.write("pool: interrupted\n")
        return EXIT_INTERRUPTED
    if args.command == "demo":
        from ._demo import run_demo
        return run_demo(start_method=args.start_method)
    return _map(args, parser)


def _map(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ._executor import _cpu_count

    def usage(message: str) -> int:
        sys.stderr.write(f"python -m pool map: error: {message}\n")
        return EXIT_USAGE

    if args.inputs and args.arg_file:
        return usage("give inputs as arguments or with -a FILE, not both")
    if (args.resume or args.resume_failed) and not args.joblog:
        return usage("--resume and --resume-failed need --joblog FILE")
    workers = args.workers or _cpu_count()
    if args.inputs:
        records = records_of_arguments(args.inputs)
        total: int | None = len(args.inputs)
    else:
        fd = 0
        if args.arg_file and args.arg_file != "-":
            try:
                fd = os.open(args.arg_file, os.O_RDONLY)
            except OSError as exc:
                return usage(f"cannot read {args.arg_file}: {exc.strerror}")
        records = records_of(fd, args.null)
        total = count(fd, args.null, args.jsonl)
    resumed = None
    try:
        if (args.resume or args.resume_failed) and os.path.exists(args.joblog):
            resumed = read_joblog(args.joblog)
        # (Resuming from a log not written yet runs everything: a retry loop's first turn.)
        joblog = None
        if args.joblog:
            joblog = Joblog(open(args.joblog, "a" if resumed is not None else "w",
                                 encoding="utf-8", errors="surrogateescape", newline="\n"),
                            write_header=resumed is None)
    except JoblogError as exc:
        return usage(str(exc))
    except OSError as exc:
        return usage(f"cannot write the job log {args.joblog}: {exc.strerror}")
    options = Options(
        function=args.function, workers=workers, chunksize=args.chunksize,
        mp_context=(multiprocessing.get_context(args.start_method)
                    if args.start_method else None),
        as_json=args.json, tag=args.tag, unordered=args.unordered, progress=args.progress,
        timeout=args.timeout, retries=args.retries, retry_on=args.retry_on, halt=args.halt,
        joblog=joblog, resume=resumed, resume_failed=args.resume_failed,
        window=args.read_ahead or max(1000, 4 * workers * args.chunksize))
    install_signal_handlers()
    # Buffered whatever PYTHONUNBUFFERED says: the run flushes whenever it would wait.
    stdout = open(sys.stdout.fileno(), "wb", buffering=1 << 16, closefd=False)
    try:
        outcome = Run(options, read_inputs(records, args.jsonl), total, stdout,
                      sys.stderr).run()
    finally:
        if joblog is not None:
            joblog.close()
    return _exit_status(outcome)


def _exit_status(outcome: Outcome) -> int:
    stopped = f"{outcome.ok} ok, {outcome.failed} failed, {outcome.not_run} not finished"
    if outcome.ended_by == "pipe":
        _silence_stdout()
        return EXIT_PIPE
    if outcome.ended_by == "interrupt":
        sys.stderr.write(f"pool map: interrupted ({stopped})\n")
        return EXIT_INTERRUPTED
    if outcome.ended_by == "signal":
        name = signal.Signals(outcome.signum).name
        sys.stderr.write(f"pool map: stopped by {name} ({stopped})\n")
        return 128 + outcome.signum
    if outcome.ended_by in ("joblog", "read_error"):
        return EXIT_USAGE
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    if outcome.failed == 0:
        return EXIT_OK
    return EXIT_MANY_FAILED if outcome.failed > 100 else outcome.failed


def _silence_stdout() -> None:
    """Standard output is a closed pipe: point it at /dev/null, so that the interpreter's
    last flush at exit does not print a BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

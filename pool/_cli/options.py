"""The command line of ``python -m pool map``: its parser and ``--help`` text, the checks
on each option's value, and the options resolved for a run (``Options``). Loading the
function is ``function``'s.

Runs in: the command's main thread, before the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import re
import sys
from typing import Any, Callable, NamedTuple, NoReturn

from .. import __version__
from .console import EXIT_USAGE
from .function import load_function
from .inputs import PARSERS
from .joblog import Joblog, Resume

RETRY_KINDS = ("died", "timeout", "error")

# The exit statuses (``console``), as ``--help`` tells them.
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
            # -0 is an option, so argparse takes "-3" for an option too, not a value.
            message += " (negative numbers are not valid values)"
        # Parsing inputs and options in any order makes argparse call INPUT required too
        # when the function is missing. It is not.
        message = message.replace("MODULE:FUNCTION, INPUT", "MODULE:FUNCTION")
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _whole_number(text)
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


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command's parser, and its ``map`` subcommand's."""
    parser = _Parser(
        prog="python -m pool",
        description="A process pool where a worker's death fails one task, not the pool.")
    parser.add_argument("--version", action="version", version=f"pool {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=_Parser)
    demo = commands.add_parser("demo", help="run a batch where one task segfaults, one is "
                               "SIGKILLed and one times out; every other task succeeds")
    demo.add_argument("--start-method", choices=multiprocessing.get_all_start_methods())
    map_parser = commands.add_parser(
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
its line ending (\\n or \\r\\n), or as the value it parses into with --parse; a blank
line is an input too (the empty string), so output lines stay aligned with input lines.

Ctrl-C, SIGTERM and SIGHUP stop the run: every worker is ended, the lines of what
finished are written, and one line on standard error says what was left.""",
        epilog=EXIT_STATUS_HELP + """
examples:
  seq 1 100 | python -m pool map math:factorial --parse int --unordered
  printf '%s\\n' '[2, 10]' '[10, -1]' | python -m pool map math:pow --jsonl --json
  python -m pool map ./resize.py:resize -a images.txt --progress --joblog run.log
  python -m pool map ./resize.py:resize -a images.txt --joblog run.log --resume-failed
  find . -name '*.json' -print0 | python -m pool map -0 ./check.py:check --tag --halt now,fail=1
""")
    map_parser.add_argument("function", type=load_function, metavar="MODULE:FUNCTION",
                            help="an importable module's function (os.path:getsize), or a "
                                 "script's (./script.py:func)")
    map_parser.add_argument("inputs", nargs="*", metavar="INPUT",
                            help="inputs, each passed as a string or as --parse says "
                                 "(default: lines of standard input); put -- before them "
                                 "if one starts with -")
    source = map_parser.add_argument_group("input")
    source.add_argument("-a", "--arg-file", metavar="FILE",
                        help="read the inputs from FILE instead of standard input")
    source.add_argument("-0", "--null", action="store_true",
                        help="inputs are separated by NUL bytes, not lines (find -print0)")
    source.add_argument("--parse", choices=tuple(PARSERS), metavar="KIND",
                        help="pass each input as KIND: str (the default: the text as it "
                             "is), int, float, json (json.loads) or literal (a Python "
                             "literal, by ast.literal_eval: numbers, strings, tuples, "
                             "lists, dicts, sets, None, True, False); an input that does not "
                             "parse fails without running (job log Outcome: invalid)")
    source.add_argument("--jsonl", action="store_true",
                        help="each line is JSON: a list is the positional arguments, an "
                             "object the keyword arguments, anything else the one argument; "
                             "blank lines are skipped (no --parse: JSON is typed already)")
    out = map_parser.add_argument_group("output")
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
    fail = map_parser.add_argument_group("failures")
    fail.add_argument("--timeout", type=_seconds, metavar="S",
                      help="stop an input that runs longer than S seconds: it fails with "
                           "the stack it was stuck in (with --chunksize N: N*S per chunk)")
    fail.add_argument("--retries", type=_non_negative_int, default=0, metavar="N",
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
    record = map_parser.add_argument_group("job log")
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
    tuning = map_parser.add_argument_group("pool")
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
    # Only for --help: ``program`` parses ``run`` itself, since everything after its
    # PROGRAM belongs to the program.
    commands.add_parser("run", add_help=False,
                        help="run a program with its process pools on pool (run --help)")
    return parser, map_parser


# ``--halt ...,fail=P%`` is judged once this many inputs have finished (fewer prove nothing).
HALT_MIN_FINISHED = 10


class Halt(NamedTuple):
    """``--halt now|soon,fail=N|P%``."""
    now: bool
    failures: int | None
    percent: float | None

    def reached(self, failed: int, finished: int) -> bool:
        if self.failures is not None:
            return failed >= self.failures
        assert self.percent is not None
        return finished >= HALT_MIN_FINISHED and failed * 100 >= self.percent * finished


@dataclasses.dataclass
class Options:
    """What the command line asked for, checked and resolved by ``main``."""
    function: Callable[..., Any]
    workers: int
    chunksize: int
    mp_context: Any
    as_json: bool
    tag: bool
    unordered: bool
    progress: bool
    timeout: float | None
    retries: int
    retry_on: frozenset[str]
    halt: Halt | None
    joblog: Joblog | None
    resume: Resume | None                   # --resume, --resume-failed
    window: int


"""``python -m pool``: the demo, and mapping a function over inputs from the command line.

Runs in: the main thread of a command-line process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import sys
from typing import Any, Callable, Iterator, Sequence

from ._executor import ProcessPool


def _load_function(spec: str) -> Callable[..., Any]:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot load {spec!r}: {exc}") from exc
    if not callable(target):
        raise argparse.ArgumentTypeError(f"{spec!r} is not callable")
    return target  # type: ignore[no-any-return]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pool",
        description="A process pool where a worker's death fails one task, not the pool.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a batch where one task segfaults and one "
                               "is SIGKILLed; every other task succeeds")
    demo.add_argument("--start-method", choices=multiprocessing.get_all_start_methods())
    run = commands.add_parser(
        "map", help="call MODULE:FUNCTION on each input (arguments, or lines of stdin)",
        description="Calls FUNCTION(input) for each input, in a pool, and prints one line per "
                    "input in input order: the result, or with --json a JSON object. A failed "
                    "input is reported on stderr and the run goes on; the exit status is 1 if "
                    "any input failed.")
    run.add_argument("function", type=_load_function, metavar="MODULE:FUNCTION")
    run.add_argument("inputs", nargs="*", metavar="INPUT",
                     help="inputs, passed as strings (default: one per line of stdin)")
    run.add_argument("-j", "--workers", type=int, default=None,
                     help="worker processes (default: the CPUs available)")
    run.add_argument("--chunksize", type=int, default=1)
    run.add_argument("--start-method", choices=multiprocessing.get_all_start_methods())
    run.add_argument("--json", action="store_true",
                     help='print {"input": ..., "result": ...} or {"input": ..., "error": ...}')
    return parser


def _inputs(given: Sequence[str]) -> Iterator[str]:
    if given:
        yield from given
    else:
        for line in sys.stdin:
            yield line.rstrip("\n")


def _run_map(args: argparse.Namespace) -> int:
    context = multiprocessing.get_context(args.start_method) if args.start_method else None
    failed = 0
    with ProcessPool(args.workers, mp_context=context) as pool:
        inputs = list(_inputs(args.inputs))
        futures = [pool.submit(args.function, item) for item in inputs]
        for item, future in zip(inputs, futures):
            error = future.exception()
            if error is not None:
                failed += 1
                message = f"{type(error).__name__}: {error}"
                print(f"input {item!r} failed: {message}", file=sys.stderr)
                if args.json:
                    print(json.dumps({"input": item, "error": message}))
            elif args.json:
                print(json.dumps({"input": item, "result": future.result()}, default=repr))
            else:
                print(future.result())
            sys.stdout.flush()
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo
        return run_demo(start_method=args.start_method)
    return _run_map(args)

"""What ``python -m pool map`` runs in a worker: the user's function over one job's inputs.

Runs in: a worker process (``setup_worker`` as the pool's initializer, ``run_job`` as the
task). Guarantees: the worker's standard output never reaches the command's standard
output, which carries results only: what the function prints through ``sys.stdout`` or
``sys.stderr`` is captured per input and sent back with its report, and what bypasses
them (C code, child processes writing to file descriptor 1) goes to standard error. An
exception is reported, not raised, so the other inputs of a chunk still run. The value is
rendered to text here, in parallel, so that what cannot be pickled still prints.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import traceback
from typing import Any, Callable, NamedTuple


class Report(NamedTuple):
    """How one input went, as the worker saw it."""
    ok: bool
    text: str          # the value rendered (plain text or JSON), or "Type: message"
    error_type: str    # the exception's class name, "" when ok
    detail: str        # the worker-side traceback, "" when ok
    output: str        # what the function printed
    pid: int
    start: float       # time.time() when the input started
    runtime: float     # seconds


def setup_worker() -> None:
    """The pool's initializer: file descriptor 1 becomes a copy of 2."""
    os.dup2(2, 1)


def run_job(fn: Callable[..., Any], calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
            as_json: bool) -> list[Report]:
    """Calls ``fn`` on each ``(args, kwargs)`` in turn and reports on each."""
    return [_run_one(fn, args, kwargs, as_json) for args, kwargs in calls]


def _run_one(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             as_json: bool) -> Report:
    captured = io.StringIO()
    start, clock = time.time(), time.perf_counter()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            value = fn(*args, **kwargs)
        text = render(value, as_json)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt fail this input alone
        runtime = time.perf_counter() - clock
        # The first frame is _run_one itself: the user's traceback starts below it.
        below = exc.__traceback__.tb_next if exc.__traceback__ else None
        # Only a traceback with frames of the user's says more than the summary line.
        detail = ("".join(traceback.format_exception(type(exc), exc, below))
                  if below is not None or exc.__cause__ or exc.__context__ else "")
        return Report(False, summary(exc), type(exc).__name__, detail, captured.getvalue(),
                      os.getpid(), start, runtime)
    return Report(True, text, "", "", captured.getvalue(), os.getpid(), start,
                  time.perf_counter() - clock)


def render(value: Any, as_json: bool) -> str:
    """The text of a result: JSON (what JSON cannot hold as its ``repr`` string), or
    ``str(value)`` with ``None`` as the empty string."""
    if as_json:
        return to_json(value)
    return "" if value is None else str(value)


def to_json(value: Any) -> str:
    """JSON text, non-ASCII characters as themselves; but a string holding bytes that were
    not UTF-8 (lone surrogates, from ``surrogateescape``) is escaped (``\\udcff``), so the
    line stays valid UTF-8 and the bytes can be recovered."""
    text = json.dumps(value, default=repr, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, default=repr)
    return text


def summary(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    try:
        message = " ".join(str(exc).split())
    except Exception:  # a broken __str__ must not hide which input failed
        message = "<the exception's message could not be rendered>"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__

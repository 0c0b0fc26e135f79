"""What ``python -m pool map`` runs in a worker: the user's function over one job's inputs.

Runs in: a worker process (``setup_worker`` as the pool's initializer, ``run_job`` as the
task), except ``take_capture``, which the command calls when a worker was lost.
Guarantees: the worker never writes to the command's standard output, which carries
results only. While an input runs, descriptors 1 and 2 point at the worker's capture file,
in a directory the command made. So all the function prints is kept with that input,
whether through ``sys.stdout``, C code or a child process; ``sys.stdout.fileno()`` works.
The capture is read back into the input's report. If the worker dies or is killed
mid-input, the command reads the file itself (``take_capture``): the output that led to a
crash is not lost. Between inputs, 1 and 2 are the command's standard error.

An exception is reported, not raised, so the other inputs of a chunk still run. The value
is rendered to text here, in parallel; rendering never fails an input.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, NamedTuple


class Report(NamedTuple):
    """How one input went, as the worker saw it."""
    ok: bool
    text: str          # the value rendered (plain text or JSON), or the exception's
                       # message alone (``message``): its type is ``error_type``
    error_type: str    # the exception's class name, "" when ok
    detail: str        # the worker-side traceback, "" when ok or when it says no more
    output: str        # what the function printed
    pid: int
    start: float       # time.time() when the input started
    runtime: float     # seconds


class _Capture:
    fd = -1            # the capture file, open for reading and appending
    stderr = -1        # a copy of the command's standard error


def capture_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.out")


def setup_worker(capture_directory: str) -> None:
    """The pool's initializer."""
    # Under fork the command's own handlers were copied here: a worker must die of the
    # SIGTERM that ends it, not report it to a run that is not in this process.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    _Capture.stderr = os.dup(2)
    os.dup2(2, 1)
    _Capture.fd = os.open(capture_path(capture_directory, os.getpid()),
                          os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)


def run_job(fn: Callable[..., Any], calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
            as_json: bool) -> list[Report]:
    """Calls ``fn`` on each ``(args, kwargs)`` in turn and reports on each."""
    return [_run_one(fn, args, kwargs, as_json) for args, kwargs in calls]


def _run_one(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             as_json: bool) -> Report:
    _begin_capture()
    start, clock = time.time(), time.perf_counter()
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt fail this input alone
        runtime = time.perf_counter() - clock
        output = _end_capture()
        below = exc.__traceback__.tb_next if exc.__traceback__ else None
        # The first frame is _run_one's: the user's traceback starts below it. Only a
        # traceback with frames of the user's, or a chain, says more than type and message.
        detail = ("".join(traceback.format_exception(type(exc), exc, below))
                  if below is not None or exc.__cause__ or exc.__context__ else "")
        return Report(False, message(exc), type(exc).__name__, detail, output,
                      os.getpid(), start, runtime)
    runtime = time.perf_counter() - clock
    output = _end_capture()
    return Report(True, render(value, as_json), "", "", output, os.getpid(), start, runtime)


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # replaced or closed by the function: nothing of ours to keep
            pass


def _begin_capture() -> None:
    if _Capture.fd < 0:   # run_job called outside the command: nothing to capture
        return
    _flush_standard_streams()
    os.ftruncate(_Capture.fd, 0)
    os.dup2(_Capture.fd, 1)
    os.dup2(_Capture.fd, 2)


def _end_capture() -> str:
    if _Capture.fd < 0:
        return ""
    _flush_standard_streams()
    os.dup2(_Capture.stderr, 1)
    os.dup2(_Capture.stderr, 2)
    text = read_capture(_Capture.fd)
    # Emptied now, not only at the next input's start: a worker lost between inputs must
    # not have this input's output shown as the next one's.
    os.ftruncate(_Capture.fd, 0)
    return text


def take_capture(directory: str, pid: int) -> str:
    """The command's side: what the input running in worker ``pid`` had printed when the
    worker was lost; the file is then removed."""
    path = capture_path(directory, pid)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return ""
    try:
        return read_capture(fd)
    except OSError:
        return ""
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


def read_capture(fd: int) -> str:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0).decode("utf-8", "backslashreplace") if size else ""


def render(value: Any, as_json: bool) -> str:
    """The text of a result: JSON, or ``str(value)`` with ``None`` as the empty string.
    What cannot be rendered so is rendered by ``repr``: the input succeeded."""
    try:
        if as_json:
            return to_json(value)
        return "" if value is None else str(value)
    except Exception:
        text = _repr(value)
        return to_json(text) if as_json else text


def to_json(value: Any) -> str:
    """Strict JSON text, with non-ASCII characters as themselves. A string that holds bytes
    that were not UTF-8 (lone surrogates from ``surrogateescape``) is escaped as
    ``\\udcff``: the line stays valid UTF-8 and the bytes can be recovered. NaN and the
    infinities, which JSON lacks, become the strings ``"nan"``, ``"inf"`` and ``"-inf"``."""
    try:
        text = json.dumps(value, default=_repr, ensure_ascii=False, allow_nan=False)
    except ValueError:   # a float JSON cannot hold, somewhere inside
        value = _finite(value)
        text = json.dumps(value, default=_repr, ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, default=_repr, allow_nan=False)
    return text


def _finite(value: Any) -> Any:
    """``value`` with each non-finite float inside lists, tuples and dicts as its repr."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    return value


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object that cannot be shown>"


def message(exc: BaseException) -> str:
    """The exception's message, ``str(exc)``, without its type (that goes beside it)."""
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not hide which input failed
        return "<the exception's message could not be rendered>"

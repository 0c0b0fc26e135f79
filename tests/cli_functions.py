"""Functions that ``python -m pool map`` calls in test_cli.py (``cli_functions:NAME``; the
tests run the command with the tests directory as its working directory).

Several of them take their bearings from the environment, which workers inherit from the
command: ``CLI_TEST_DIR`` is a scratch directory where they record what ran (the file
``ran``, one input per line), write their pid (``pid-INPUT``) and wait for gates, and
``CLI_TEST_CALM`` makes ``act`` treat every input as a plain success (so that a resumed run
over the same inputs does not sleep or fail again).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time

WAIT_LIMIT = 60.0


def _dir() -> str | None:
    return os.environ.get("CLI_TEST_DIR")


def _path(name: str) -> str:
    directory = _dir()
    assert directory, "CLI_TEST_DIR is not set"
    return os.path.join(directory, name)


def _record(text: str) -> None:
    if _dir():
        # One write of a short line in append mode: lines from several workers never mix.
        fd = os.open(_path("ran"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (text + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)


def _touch(name: str, content: str = "") -> None:
    path = _path(name)
    # A temporary name of its own for each call: ``stubborn``'s SIGTERM handler calls this,
    # and the pool's teardown signals a worker and its group, two SIGTERMs, whose handlers
    # can nest; with one shared name the outer call's replace found its file gone (seen
    # once in CI as a FileNotFoundError traceback).
    temporary = f"{path}.{os.getpid()}.{next(_touches)}.tmp"
    with open(temporary, "w") as f:
        f.write(content)
    os.replace(temporary, path)   # appears whole: a reader never sees it half written


_touches = itertools.count()


def _wait_for(name: str) -> None:
    path = _path(name)
    deadline = time.monotonic() + WAIT_LIMIT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def segfault() -> None:
    ctypes.string_at(0)


def act(text: str) -> str:
    """Records ``text`` in ``ran``, then by its form:

    ``fail...``         raises ValueError
    ``failwhen:NAME``   waits until input NAME has started (its pid file), then raises
    ``exit3``           the worker exits with status 3 (``os._exit``)
    ``segv``            the worker segfaults
    ``sleepN``          writes its pid to ``pid-sleepN``, sleeps N seconds, returns the input
    ``hold``            writes its pid to ``pid-hold``, waits for the file ``release``
    ``stubborn``        ignores SIGTERM (writing the file ``got-term`` when it comes), writes
                        its pid to ``pid-stubborn`` and sleeps 60 s
    anything else       returns the input
    """
    _record(text)
    if os.environ.get("CLI_TEST_CALM"):
        return text
    if text.startswith("failwhen:"):
        _wait_for("pid-" + text.partition(":")[2])
        raise ValueError(f"failed on {text}")
    if text.startswith("fail"):
        raise ValueError(f"failed on {text}")
    if text == "exit3":
        os._exit(3)
    if text == "segv":
        segfault()
    if text.startswith("sleep"):
        _touch("pid-" + text, str(os.getpid()))
        time.sleep(float(text[len("sleep"):]))
    if text == "hold":
        _touch("pid-hold", str(os.getpid()))
        _wait_for("release")
    if text == "stubborn":
        signal.signal(signal.SIGTERM, lambda signum, frame: _touch("got-term"))
        _touch("pid-stubborn", str(os.getpid()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:   # (a signal handler cuts a sleep short)
            time.sleep(0.1)
    return text


def gate(text: str) -> str:
    """``slow`` waits until the file ``release`` exists; anything else writes ``done-TEXT``,
    prints ``printed TEXT`` (which the command shows when it takes the result) and returns
    at once."""
    if text == "slow":
        _wait_for("release")
    else:
        _touch("done-" + text)
        print(f"printed {text}")
    return text


def nap(text: str) -> str:
    """Sleeps ``float(text)`` seconds (where a ``--timeout`` finds it stuck)."""
    time.sleep(float(text))
    return text


def fail_odd(text: str) -> int:
    number = int(text)
    if number % 2:
        raise ValueError(f"odd: {number}")
    return number


def print_everywhere(text: str) -> str:
    """Prints through every route there is; only the returned value is a result."""
    print(f"print {text}")
    print(f"stderr {text}", file=sys.stderr)
    sys.stdout.flush()
    os.write(1, f"fd1 {text}\n".encode())
    subprocess.run(["echo", f"child {text}"], check=True)
    return f"result {text}"


class Unpicklable:
    """Holds a lock: cannot be pickled, nor put in JSON."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return "Unpicklable()"

    def __str__(self) -> str:
        return "an unpicklable thing"


def special(text: str) -> object:
    """Values that test how results are written."""
    return {
        "none": None,
        "newline": "two\nlines",
        "cr": "a\rb",
        "bang": "!bang",
        "set": {1},
        "unpicklable": Unpicklable(),
        "dict": {"k": [1, 2]},
        "nan": {"ratio": float("nan"), "ok": [1.5, float("-inf")]},
    }[text]


def show(*args: object, **kwargs: object) -> str:
    """The call it got, as JSON: [args, kwargs]."""
    return json.dumps([list(args), kwargs], sort_keys=True)


def flaky(text: str) -> str:
    """Fails (an exception) the first time it sees ``text``, succeeds after."""
    marker = "flaky-" + text
    if not os.path.exists(_path(marker)):
        _touch(marker)
        raise RuntimeError(f"first attempt at {text}")
    return text


def flaky_death(text: str) -> str:
    """Kills its worker (``os._exit(4)``) the first time it sees ``text``, succeeds after."""
    marker = "dies-" + text
    if not os.path.exists(_path(marker)):
        _touch(marker)
        os._exit(4)
    return text


def last_words(text: str) -> str:
    """Prints through Python and through descriptor 1, then its worker dies: ``segv``
    segfaults, ``kill`` is SIGKILLed, anything else returns."""
    print(f"last words {text}", flush=True)
    os.write(1, f"fd words {text}\n".encode())
    if text == "segv":
        segfault()
    if text == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return text

"""Delays injected at named points, for the shake harness (``tests/shake.py``): it runs the
signal and exit paths many times with the threads' interleavings shaken, and a test that
must hit one race exactly puts a fixed delay at the point that opens it.

Owns: the list of named points (``POINTS``) and the settings read from ``POOL_SHAKE``.
Runs in: any thread of any process of pool (the parent, the command line, the workers).
Guarantees: off unless the environment variable ``POOL_SHAKE`` was set when pool was
imported. Off, a point costs a module attribute read and a branch: each point is written
``if _shake.on: _shake.pause("name")``. On, ``pause`` only sleeps and takes no lock; what
it raises is what a signal raises in that sleep (a KeyboardInterrupt: the race a delay
opens), and a malformed setting fails at import, loudly.
Assumes: only tests set ``POOL_SHAKE``.

``POOL_SHAKE`` is a comma-separated list of ``key=value``:

- ``seed=N``: random delays at every point, the same sequence for the same seed and pid;
- ``max=SECONDS`` (default 0.005): the longest random delay;
- ``p=P`` (default 0.3): the chance that a point pauses at all;
- ``switch=SECONDS`` (default 1e-5 once ``seed`` is set): ``sys.setswitchinterval``, so that
  threads change hands far more often than every 5 ms;
- ``at=NAME:SECONDS`` (repeatable, joined by ``+``): always pause that long at that point,
  and nowhere else unless ``seed`` is set too. This is how a test opens one race on purpose;
- ``tell=1``: write ``pool shake: at NAME`` to standard error as such a fixed pause begins,
  so that the test acts while the race is open, not after a sleep and a hope.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import random

# Every point, with where it is and what a delay there widens. A point not listed here
# is a mistake: ``pause`` asserts it, and tests/test_shake.py checks the code against it.
POINTS = {
    # The dispatcher: its loop thread, and callers at its front door.
    "loop.after_wait": "the loop was woken, before it looks at anything",
    "loop.before_exits": "replies delivered, before exited workers are handled",
    "loop.before_end": "the loop is done, before it tells the callers it ended",
    "loop.after_end": "the callers were told the loop ended, before its thread returns",
    "front.before_wake": "a command was queued, before the loop is woken",
    # Waiting and resolving: any caller thread, and the thread that resolves a future.
    "latch.between_slices": "a caller waiting on a latch (a result, a join), between slices",
    "future.before_wake": "a future is done, before its waiters are released",
    # Interpreter exit.
    "exit.hook_entry": "the exit hook's first line, before it guards against Ctrl-C",
    "exit.before_pools": "the exit hook runs, before it ends the pools",
    # The command line (python -m pool map).
    "cli.loop_turn": "the run's main loop, at the top of each turn",
    "cli.after_signal": "a stop signal was counted, before its event is posted",
    "cli.before_end_pool": "the run is ending, before the workers are stopped",
    "cli.before_write": "lines are about to be written to standard output",
    "cli.reader_next": "the reader thread, before it reads the next input",
    # The worker process.
    "worker.before_reply": "a task is done, before its reply is written",
}

on = False
_random_delays = False
_max_seconds = 0.005
_chance = 0.3
_fixed: dict[str, float] = {}
_tell = False
_rng: random.Random | None = None
_seed = 0
_rng_pid = 0


def pause(name: str) -> None:
    """Sleep here, if the settings say so: a fixed delay for this point, else a random one
    with the set chance."""
    assert name in POINTS, f"pool._shake: unknown point {name!r}"
    delay = _fixed.get(name)
    if delay is not None and _tell:
        os.write(2, f"pool shake: at {name}\n".encode())
    if delay is None and _random_delays:
        rng = _process_rng()
        if rng.random() < _chance:
            delay = rng.random() * _max_seconds
    if delay:
        _sleep(delay)


# The longest a signal that lands just before a delay's sleep waits to be raised. The test
# that is told a delay began (``tell``) signals at once, and may land after the
# interpreter's last check and before ``time.sleep`` starts: one sleep of the whole delay
# would then hold the KeyboardInterrupt for all of it (seen under load: a 30 s delay, a
# test's 30 s timeout).
_SLEEP_SLICE_SECONDS = 0.05


def _sleep(delay: float) -> None:
    deadline = time.monotonic() + delay
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, _SLEEP_SLICE_SECONDS))  # a pending signal is raised after it


def _process_rng() -> random.Random:
    """One generator per process: a forked child must not repeat its parent's delays."""
    global _rng, _rng_pid
    pid = os.getpid()
    if _rng is None or _rng_pid != pid:
        import random   # only once on: a worker must not pay for the import
        _rng = random.Random(f"{_seed}:{pid}")
        _rng_pid = pid
    return _rng


def configure(setting: str) -> None:
    """Applies a ``POOL_SHAKE`` setting (see the module's docstring); an empty one turns
    every point off."""
    global on, _random_delays, _max_seconds, _chance, _seed, _rng, _tell
    fields = dict.fromkeys(("seed", "max", "p", "switch", "at", "tell"), "")
    for part in filter(None, setting.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"POOL_SHAKE: cannot read {part!r} in {setting!r}")
        fields[key] = value
    fixed = {}
    for entry in filter(None, fields["at"].split("+")):
        name, _, seconds = entry.rpartition(":")
        if name not in POINTS:
            raise ValueError(f"POOL_SHAKE: no point named {name!r}")
        fixed[name] = float(seconds)
    _fixed.clear()
    _fixed.update(fixed)
    _random_delays = bool(fields["seed"])
    _seed = int(fields["seed"] or 0)
    _rng = None
    _max_seconds = float(fields["max"] or 0.005)
    _chance = float(fields["p"] or 0.3)
    _tell = fields["tell"] not in ("", "0")
    switch = fields["switch"] or ("1e-5" if _random_delays else "")
    if switch:
        sys.setswitchinterval(float(switch))
    on = _random_delays or bool(_fixed)


configure(os.environ.get("POOL_SHAKE", ""))

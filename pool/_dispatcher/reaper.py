"""The reaper: what is left of workers once their slots have moved on.

Owns: the workers the pool could not reap (they survived SIGKILL's grace, or their exit
was seen but not their reap), and the process groups whose members outlived their worker.
Runs in: the dispatcher thread only.
Guarantees: a worker given up on is reported by pid when it is given up on, and tried once
more when the pool ends, then reported again if it is still there; a process group is
watched until it is empty, or reported by pid once SIGKILL's grace has passed. Nothing is
assumed gone: the loop does not end while a group is watched (``watching``).
Assumes: a group is watched only after its leader was reaped (while a member is left, the
kernel keeps the group's id from being reused).
"""

from __future__ import annotations

import logging
import time

from .._worker import teardown
from .._worker.handle import Exit, WorkerHandle

logger = logging.getLogger("pool")

# While a worker's process group still has running members after the worker's exit, the
# loop re-checks it this often. Only then: an idle pool never wakes up on its own.
LINGERING_POLL_SECONDS = 0.01


class Reaper:
    """Keeps what the loop could not confirm gone, until it is, or is reported."""

    def __init__(self, pool_name: str, kill_grace: float) -> None:
        self._pool_name = pool_name
        self._kill_grace = kill_grace
        self._abandoned: list[WorkerHandle] = []  # tried once more when the pool ends
        self._lingering: dict[int, float] = {}    # process group -> when to give up on it

    @property
    def watching(self) -> bool:
        """Some process group is still watched: the loop may not end yet."""
        return bool(self._lingering)

    def wait_timeout(self, timeout: float | None) -> float | None:
        """How long the loop may wait for something to happen: ``timeout``, shortened to
        the next look at the groups still watched."""
        if not self._lingering:
            return timeout
        return min(timeout if timeout is not None else 1.0, LINGERING_POLL_SECONDS)

    def watch_group(self, exited: Exit) -> None:
        """Watch the group of a worker that has just been reaped, if members are left: they
        were SIGKILLed with it, and may take a moment to go."""
        if exited.group_left:
            self._lingering[exited.pid] = time.monotonic() + self._kill_grace

    def check_groups(self) -> None:
        """Stop watching the groups that are empty now, and those past SIGKILL's grace,
        reporting who is left in those."""
        if not self._lingering:
            return
        now = time.monotonic()
        for group, give_up_at in list(self._lingering.items()):
            left = teardown.live_group_members(group)
            if not left:
                del self._lingering[group]
            elif now >= give_up_at:
                del self._lingering[group]
                logger.error("%s: processes %s of a worker's process group %d are still "
                             "running %g s after SIGKILL; giving up on them", self._pool_name,
                             left, group, self._kill_grace)

    def unreaped(self, worker: WorkerHandle, what_happened: str) -> None:
        """Report a worker whose reap failed (``what_happened`` says when), and keep it for
        one last try."""
        logger.error("%s: worker pid %d %s", self._pool_name, worker.pid, what_happened)
        self._abandoned.append(worker)

    def abandon(self, worker: WorkerHandle) -> Exit:
        """Give up on a worker that outlived SIGKILL's grace (stuck in the kernel): report it
        by pid, release what it held but its ``Process``, and keep it for one last try."""
        logger.error("%s: worker pid %d is still alive %g s after SIGKILL; giving up on it "
                     "(its slot gets a new worker)", self._pool_name, worker.pid,
                     self._kill_grace)
        exited = worker.abandon()
        self._abandoned.append(worker)
        return exited

    def last_try(self) -> None:
        """As the pool ends: try once more to reap every worker given up on. One stuck for
        good stays named in the log."""
        for worker in self._abandoned:
            if not worker.reap_abandoned(timeout=0.1):
                logger.error("%s: worker pid %d was never confirmed gone", self._pool_name,
                             worker.pid)
        self._abandoned.clear()

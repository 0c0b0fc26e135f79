"""Thousands of tasks while workers die at random: every future resolves, and only the
tasks whose worker died fail. Short by default; ``--stress-seconds N`` runs longer."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

import pool
import tasks
from helpers import full_volume


@pytest.mark.stress
@pytest.mark.isolated
def test_random_deaths_fail_only_their_own_tasks(ctx, request):
    seconds = request.config.getoption("--stress-seconds")
    deadline = time.monotonic() + seconds
    seed_base, totals = 0, {"deaths": 0, "outside kills": 0}
    batch = 3000 if seconds or full_volume(ctx.get_start_method()) else 1000
    while True:
        for key, count in _one_batch(ctx, seed_base, batch).items():
            totals[key] += count
        seed_base += batch
        if time.monotonic() >= deadline:
            break
    print(f"\nstress[{ctx.get_start_method()}]: {seed_base} tasks, {totals['deaths']} "
          f"workers died in their task, {totals['outside kills']} killed from outside")


def _one_batch(ctx, seed_base, count):
    known_pids: list[int] = []   # workers that have run a task: READY, fair game to kill
    killed: set[int] = set()
    stop = threading.Event()
    rng = random.Random(seed_base)

    def killer():
        while not stop.wait(0.05):
            if known_pids:
                pid = rng.choice(known_pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass

    with pool.ProcessPool(2, mp_context=ctx) as p:
        def note_pid(future):
            if not future.exception():
                known_pids.append(future.result()[1])

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            futures = {}
            for seed in range(seed_base, seed_base + count):
                futures[seed] = p.submit(tasks.random_fate, seed)
                futures[seed].add_done_callback(note_pid)
            outcomes = {seed: f.exception(120) for seed, f in futures.items()}
        finally:
            stop.set()
            thread.join()
        assert p.submit(tasks.square, 3).result(60) == 9  # still working

    pids_failed_from_outside = []
    for seed, error in outcomes.items():
        fate = tasks.fate_of(seed)
        if (isinstance(error, pool.WorkerDied) and error.signal_name == "SIGKILL"
                and error.pid in killed):
            pids_failed_from_outside.append(error.pid)  # whatever the task would have done
        elif fate == "raises":
            assert isinstance(error, ValueError), (seed, error)
        elif fate == "dies":
            assert isinstance(error, pool.WorkerDied), (seed, error)
            assert error.task.args == (seed,)
        else:
            assert error is None, (seed, error)
            assert futures[seed].result()[0] == seed
    # A worker runs one task at a time: each kill fails at most one task.
    assert len(pids_failed_from_outside) == len(set(pids_failed_from_outside))
    deaths = sum(tasks.fate_of(seed) == "dies" for seed in outcomes)
    return {"deaths": deaths, "outside kills": len(killed)}

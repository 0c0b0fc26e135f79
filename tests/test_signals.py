"""Signals, interpreter exit, parent death and asyncio: every path ends promptly, leaves no
process behind, and does not spin.

Each scenario runs in a child interpreter in its own session, so that a signal can be sent
to its whole process group as a terminal (Ctrl-C) or a service manager (SIGTERM) would.
Exit times are printed (``pytest -s``) for the record; the assertions bound them loosely,
since they only guard against waiting for the tasks (which would take a minute).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

import pool
import tasks
from helpers import START_METHODS, Scenario, group_members, process_exists, wait_until

# Two workers each run a task that started a grandchild and hangs; five more tasks queue.
BUSY_POOL = '''
import atexit
atexit.register(lambda: print("CPU_AT_EXIT", time.process_time(), flush=True))
pid_dir = os.path.abspath("pids")
os.makedirs(os.path.join(pid_dir, "children"))
def everything():
    return tasks.announced_pids(pid_dir) | tasks.announced_pids(os.path.join(pid_dir, "children"))
def started(p, task=tasks.start_subprocess_then_hang):
    running = [p.submit(task, pid_dir) for _ in range(2)]
    queued = [p.submit(tasks.square, i) for i in range(5)]
    helpers.wait_until(lambda: len(everything()) == 4, 60)
    print("PIDS", json.dumps(sorted(everything())), flush=True)
    print("CPU_BEFORE", time.process_time(), flush=True)
    print("READY", flush=True)
    return running + queued
'''

CTRL_C_IN_WITH = BUSY_POOL + '''
with pool.ProcessPool(2, mp_context=CTX) as p:
    futures = started(p)
    futures[0].result()
'''

CTRL_C_WHILE_SHUTDOWN_WAITS = BUSY_POOL + '''
p = pool.ProcessPool(2, mp_context=CTX)
futures = started(p)
p.shutdown(wait=True)
'''

CTRL_C_AT_TOP_LEVEL = BUSY_POOL + '''
p = pool.ProcessPool(2, mp_context=CTX)  # never shut down: the exit hook has to do it
futures = started(p)
time.sleep(120)
'''

ASYNCIO_CTRL_C = BUSY_POOL + '''
import asyncio
async def main():
    async with pool.ProcessPool(2, mp_context=CTX) as p:
        running = [p.submit(tasks.start_subprocess_then_hang, pid_dir) for _ in range(2)]
        helpers.wait_until(lambda: len(everything()) == 4, 60)
        print("PIDS", json.dumps(sorted(everything())), flush=True)
        print("CPU_BEFORE", time.process_time(), flush=True)
        print("READY", flush=True)
        await asyncio.gather(*running)
asyncio.run(main())
'''

# The idiomatic asyncio service: SIGTERM cancels the main task, and the pool is a plain
# ``with`` around ``asyncio.run``, so it is left by CancelledError.
ASYNCIO_SIGTERM_CANCELS_MAIN = BUSY_POOL + '''
import asyncio
async def main(p):
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    running = [loop.run_in_executor(p, tasks.start_subprocess_then_hang, pid_dir)
               for _ in range(2)]
    helpers.wait_until(lambda: len(everything()) == 4, 60)
    print("PIDS", json.dumps(sorted(everything())), flush=True)
    print("CPU_BEFORE", time.process_time(), flush=True)
    print("READY", flush=True)
    await asyncio.gather(*running)
with pool.ProcessPool(2, mp_context=CTX) as p:
    asyncio.run(main(p))
'''


def interrupted(scenario_body, method, tmp_path, signum=signal.SIGINT, to_group=True):
    """Run a busy-pool scenario, signal its group once it is busy, and return the facts."""
    scenario = Scenario(scenario_body, method, tmp_path)
    try:
        pids = json.loads(scenario.read_until("PIDS"))
        cpu_before = float(scenario.read_until("CPU_BEFORE"))
        scenario.read_until("READY")
        sent = scenario.signal_group(signum) if to_group else scenario.signal_leader(signum)
        code, ended, out, err = scenario.wait(30)  # stdout closes when every holder is gone
    finally:
        scenario.close()
    cpu_lines = [line for line in out.splitlines() if line.startswith("CPU_AT_EXIT")]
    cpu = float(cpu_lines[0].split()[1]) - cpu_before if cpu_lines else None
    print(f"\n{method}: exited {ended - sent:.3f} s after the signal, parent CPU in "
          f"teardown {cpu}")
    return {"code": code, "seconds": ended - sent, "pids": pids, "cpu": cpu,
            "stderr": err, "group": scenario.proc.pid}


def assert_all_gone(facts):
    assert wait_until(lambda: not any(process_exists(pid) for pid in facts["pids"]), 5), \
        [pid for pid in facts["pids"] if process_exists(pid)]
    # multiprocessing's resource tracker (in the script's group) leaves once its pipe
    # closes; nothing else may be left.
    assert wait_until(lambda: not group_members(facts["group"]), 5), group_members(facts["group"])


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("scenario", ["in with", "while shutdown waits", "at top level"])
def test_ctrl_c_cancels_queued_tasks_and_terminates_running_ones(method, scenario, tmp_path):
    body = {"in with": CTRL_C_IN_WITH, "while shutdown waits": CTRL_C_WHILE_SHUTDOWN_WAITS,
            "at top level": CTRL_C_AT_TOP_LEVEL}[scenario]
    facts = interrupted(body, method, tmp_path)
    assert facts["code"] == -signal.SIGINT  # an unhandled KeyboardInterrupt, as usual
    assert facts["seconds"] < 5             # the tasks would have run for minutes
    assert_all_gone(facts)
    assert facts["cpu"] is not None and facts["cpu"] < 0.2
    # The workers ignore SIGINT and print nothing: one traceback, the script's own.
    assert facts["stderr"].count("Traceback") == 1 and "KeyboardInterrupt" in facts["stderr"]


@pytest.mark.parametrize("method", START_METHODS)
def test_sigterm_to_the_whole_group_ends_everything(method, tmp_path):
    facts = interrupted(CTRL_C_IN_WITH, method, tmp_path, signal.SIGTERM)
    assert facts["code"] == -signal.SIGTERM
    assert facts["seconds"] < 5
    assert_all_gone(facts)


@pytest.mark.parametrize("method", START_METHODS)
def test_cancelled_error_leaving_with_terminates_like_ctrl_c(method, tmp_path):
    # SIGTERM to the parent alone (as a service manager's "mixed" kill mode): the workers
    # get nothing from outside; only the pool can end them, and it must not wait for them.
    facts = interrupted(ASYNCIO_SIGTERM_CANCELS_MAIN, method, tmp_path, signal.SIGTERM,
                        to_group=False)
    assert facts["code"] == 1 and "CancelledError" in facts["stderr"]
    assert facts["seconds"] < 5  # the tasks would have run for minutes
    assert_all_gone(facts)


@pytest.mark.parametrize("method", START_METHODS)
def test_ctrl_c_under_asyncio_run_stops_the_awaited_tasks(method, tmp_path):
    facts = interrupted(ASYNCIO_CTRL_C, method, tmp_path)
    assert facts["code"] == -signal.SIGINT
    assert facts["seconds"] < 5
    assert_all_gone(facts)
    assert facts["cpu"] is not None and facts["cpu"] < 0.2


PARENT_KILLED = '''
pid_dir = os.path.abspath("pids")
os.makedirs(os.path.join(pid_dir, "children"))
p = pool.ProcessPool(2, mp_context=CTX)
running = [p.submit(tasks.start_subprocess_then_hang, pid_dir) for _ in range(2)]
everything = lambda: (tasks.announced_pids(pid_dir) |
                      tasks.announced_pids(os.path.join(pid_dir, "children")))
helpers.wait_until(lambda: len(everything()) == 4, 60)
copy = os.fork()  # a copy of the parent that outlives it: it must not keep workers alive
if copy == 0:
    time.sleep(60)
    os._exit(0)
print("PIDS", json.dumps(sorted(everything())), flush=True)
print("COPY", copy, flush=True)
time.sleep(120)
'''


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("method", START_METHODS)
def test_workers_and_their_children_exit_when_the_parent_is_killed(method, tmp_path):
    scenario = Scenario(PARENT_KILLED, method, tmp_path)
    try:
        pids = json.loads(scenario.read_until("PIDS"))
        copy = int(scenario.read_until("COPY"))
        import time
        sent = time.monotonic()
        os.kill(scenario.proc.pid, signal.SIGKILL)
        scenario.proc.wait(30)
        gone = wait_until(lambda: not any(process_exists(pid) for pid in pids), 5)
        print(f"\n{method}: workers and their children gone "
              f"{time.monotonic() - sent:.3f} s after the parent's SIGKILL")
        assert gone, [pid for pid in pids if process_exists(pid)]
        assert process_exists(copy)  # the forked copy lives on, without the lifeline
    finally:
        scenario.close()


BLOCKED_CALLBACK_AT_EXIT = '''
import threading
p = pool.ProcessPool(1, mp_context=CTX, stop_grace=0.5)
forever = p.submit(tasks.sleep_then, 0.3, 1)
forever.add_done_callback(lambda f: threading.Event().wait())   # never returns
forever.result(60)
seen = []
later = p.submit(tasks.sleep_then, 0.3, 2)
later.add_done_callback(lambda f: seen.append(f.result()))
later.result(60)
helpers.wait_until(lambda: seen, 10)  # another future's callback is not held up
print("WORKER", p.submit(tasks.pid_of_worker).result(60), flush=True)
print("SEEN", json.dumps(seen), flush=True)
# The interpreter exits with the pool open and a callback blocked forever.
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_a_callback_that_blocks_forever_holds_up_neither_results_nor_exit(method, tmp_path):
    scenario = Scenario(BLOCKED_CALLBACK_AT_EXIT, method, tmp_path)
    try:
        worker = int(scenario.read_until("WORKER"))
        assert json.loads(scenario.read_until("SEEN")) == [2]
        code, _, _, err = scenario.wait(30)
    finally:
        scenario.close()
    assert code == 0, err
    assert "not waiting for 1 done-callback(s) still running" in err
    assert not process_exists(worker)


IDLE = '''
def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
with pool.ProcessPool(2, mp_context=CTX) as p:
    both = [p.submit(tasks.sleep_then, 0.5, None) for _ in range(2)]  # start both workers
    [f.result(60) for f in both]
    workers = sorted(set(p.map(tasks.pid_of_worker, range(8))))
    time.sleep(0.5)
    parent0, workers0 = time.process_time(), [cpu_of(w) for w in workers]
    time.sleep(3)
    parent1, workers1 = time.process_time(), [cpu_of(w) for w in workers]
report(parent=parent1 - parent0, workers=[b - a for a, b in zip(workers0, workers1)])
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_an_idle_pool_uses_no_cpu(method, tmp_path):
    from helpers import run_script
    facts, _ = run_script(IDLE, method, tmp_path, timeout=60)
    print(f"\n{method}: 3 s idle: parent {facts['parent']:.4f} s CPU, workers {facts['workers']}")
    assert facts["parent"] < 0.03                     # under 1% of a core
    assert all(cpu < 0.03 for cpu in facts["workers"])


@pytest.mark.isolated
def test_cancelling_a_coroutine_that_awaits_a_task_stops_or_cancels_it(ctx, tmp_path):
    pid_dir = str(tmp_path)

    async def main():
        async with pool.ProcessPool(1, mp_context=ctx) as p:
            running_future = p.submit(tasks.hang, pid_dir)
            queued_future = p.submit(tasks.square, 3)

            async def call(future):
                return await future
            running = asyncio.ensure_future(call(running_future))
            queued = asyncio.ensure_future(call(queued_future))
            while not tasks.announced_pids(pid_dir):
                await asyncio.sleep(0.01)
            (pid,) = tasks.announced_pids(pid_dir)
            queued.cancel()
            running.cancel()
            for task in (running, queued):
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert queued_future.cancelled()
            assert wait_until(running_future.cancelled, 30)
            assert wait_until(lambda: not process_exists(pid), 5)
            assert await p.submit(tasks.square, 4) == 16  # the pool carries on
    asyncio.run(main())


ASYNC_CLOSE = '''
import asyncio
async def main():
    async with pool.ProcessPool(1, mp_context=CTX) as p:
        p.submit(tasks.sleep_then, 1.0)           # still running when the block ends
        print("CPU_BEFORE", time.process_time(), flush=True)
        started = time.monotonic()
    print("CLOSED_AFTER", time.monotonic() - started, flush=True)
    print("CPU_AFTER", time.process_time(), flush=True)
asyncio.run(main())
'''


@pytest.mark.parametrize("method", START_METHODS)
def test_async_with_waits_for_tasks_without_spinning(method, tmp_path):
    scenario = Scenario(ASYNC_CLOSE, method, tmp_path)
    try:
        before = float(scenario.read_until("CPU_BEFORE"))
        closed_after = float(scenario.read_until("CLOSED_AFTER"))
        after = float(scenario.read_until("CPU_AFTER"))
        code, _, _, err = scenario.wait(30)
    finally:
        scenario.close()
    print(f"\n{method}: async close took {closed_after:.3f} s, {after - before:.4f} s CPU")
    assert code == 0, err
    assert closed_after >= 0.5           # it did wait for the running task
    assert after - before < 0.2          # and slept meanwhile

"""The portable path, run on Linux: ``POOL_PORTABLE=1`` turns off every Linux-only
mechanism ``pool._platform`` lists, so the path a macOS or BSD user runs is the one tested.

Each scenario runs in a child interpreter, under each start method, once with the switch
and once without. With it: the task pipe is not in packet mode and has no second reader,
no pipe is resized, nothing under /proc is opened by the parent or by a worker, and the
worker has taken its parent's choice even though its own environment no longer says so.
Without it, on Linux, each of those facts is the other way round: the scenario can tell
the two paths apart. Both ways the pool works end to end: tasks, a 64 MiB argument and
result, a worker SIGKILLed while running a task (that task fails, the next one runs), a task
a stopped worker never read (re-queued when it is killed), a timeout, and shutdown.
"""

from __future__ import annotations

import sys

import pytest

from helpers import START_METHODS, run_script
from pool import _platform

SCENARIO = '''
import fcntl
from pool import _platform
facts = {"parent_flags": {name: getattr(_platform, name) for name in (
    "PORTABLE", "PACKET_PIPES", "PIPE_RESIZE", "PROC", "UNREAD_ON_WRITE_END", "MEMFD",
    "SHARED_MEMORY", "CPU_AFFINITY", "POLL_READER_GONE")}}
# From now on the environment says nothing: a worker (and the forkserver, started below)
# must take the parent's choice, not read its own.
os.environ.pop("POOL_PORTABLE", None)
tasks.watch_proc_opens()
F_GETPIPE_SZ = 1032  # Linux's; read here only to see that pool left the size alone
MiB = 1 << 20

with pool.ProcessPool(1, mp_context=CTX, initializer=tasks.watch_proc_opens,
                      max_memory_per_child=1 << 40) as p:
    assert [p.submit(tasks.square, i).result(60) for i in range(5)] == [0, 1, 4, 9, 16]
    (handle,) = p._dispatcher._loop._workers.values()
    facts["packet_mode"] = bool(fcntl.fcntl(handle.task_fd, fcntl.F_GETFL) & os.O_DIRECT)
    facts["second_reader"] = handle.reclaim_fd is not None
    facts["count_fd"] = handle.count_fd is not None

    # 64 MiB each way: bytes go through shared memory where there is (and the pipes are
    # left alone), text through the pipes. Each pipe is checked right after: a grown pipe
    # shrinks back only before the next small frame through it.
    assert p.submit(tasks.byte_sum, bytes(64 * MiB)).result(120) == (64 * MiB, 0)
    assert len(p.submit(tasks.make_bytes, 64 * MiB).result(120)) == 64 * MiB
    (handle,) = p._dispatcher._loop._workers.values()
    facts["bytes_pipe_sizes"] = [fcntl.fcntl(handle.task_fd, F_GETPIPE_SZ),
                                 fcntl.fcntl(handle.reader.fd, F_GETPIPE_SZ)]
    facts["desk"] = handle.desk is not None
    assert p.submit(len, "x" * (64 * MiB)).result(120) == 64 * MiB
    facts["task_pipe_size"] = fcntl.fcntl(handle.task_fd, F_GETPIPE_SZ)
    assert len(p.submit(tasks.make_text, 64 * MiB).result(120)) == 64 * MiB
    facts["reply_pipe_size"] = fcntl.fcntl(handle.reader.fd, F_GETPIPE_SZ)
    facts["worker"] = p.submit(tasks.platform_facts).result(60)
    facts["rss"] = p.stats().workers[0].rss

    # A death fails the task it ran, and only that one.
    died = p.submit(tasks.sigkill_self).exception(60)
    facts["died"] = type(died).__name__
    assert p.submit(tasks.square, 6).result(60) == 36

    # A task written to a stopped worker's pipe, never read, runs again once it is killed.
    pid = p.submit(tasks.pid_of_worker).result(60)
    (handle,) = p._dispatcher._loop._workers.values()
    os.kill(pid, signal.SIGSTOP)
    # (Until the kernel shows it stopped, an idle worker may still wake and read the call.)
    assert helpers.wait_until(lambda: tasks.is_stopped(pid), 30)
    unread = p.submit(tasks.square, 7)
    assert helpers.wait_until(lambda: handle._unread_task_bytes() > 0, 30)  # written
    os.kill(pid, signal.SIGKILL)
    facts["unread_task"] = unread.result(60)
    facts["deaths"] = p.stats().worker_deaths

    timed_out = p.schedule(tasks.sleep_then, (60,), timeout=0.5).exception(60)
    facts["timed_out"] = type(timed_out).__name__
    assert p.submit(tasks.square, 8).result(60) == 64
facts["parent_proc_opens"] = tasks.proc_opens()
report(**facts)
'''


def run(method: str, tmp_path, portable: bool) -> dict:
    facts, _ = run_script(SCENARIO, method, tmp_path, timeout=240,
                          env={"POOL_PORTABLE": "1" if portable else None})
    # Whichever path, the pool worked end to end.
    assert facts["died"] == "WorkerDied"
    assert facts["unread_task"] == 49  # never begun, so run again, not failed
    assert facts["deaths"] == 2
    assert facts["timed_out"] == "TaskTimeout"
    assert facts["children_left"] == [] and facts["threads_left"] == []
    # The worker decided as its parent did, whatever its environment said.
    assert facts["worker"]["flags"] == facts["parent_flags"]
    return facts


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", START_METHODS)
def test_portable_mode_takes_the_posix_path_everywhere_and_works(method, tmp_path):
    facts = run(method, tmp_path, portable=True)
    assert facts["parent_flags"] == {"PORTABLE": True, **dict.fromkeys(
        ("PACKET_PIPES", "PIPE_RESIZE", "PROC", "UNREAD_ON_WRITE_END", "MEMFD",
         "SHARED_MEMORY", "CPU_AFFINITY", "POLL_READER_GONE"), False)}
    assert not facts["packet_mode"] and not facts["second_reader"] and not facts["desk"]
    assert facts["count_fd"]  # what is unread is asked of a read end, as on macOS
    assert facts["task_pipe_size"] == facts["reply_pipe_size"] == 64 << 10  # untouched
    assert facts["parent_proc_opens"] == [] and facts["worker"]["proc_opens"] == []
    assert facts["rss"] is None


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's own path")
@pytest.mark.parametrize("method", START_METHODS)
def test_without_the_switch_linux_takes_its_own_path(method, tmp_path):
    # What tells the paths apart in the test above, the other way round: it would fail
    # had the switch not turned each mechanism off.
    facts = run(method, tmp_path, portable=False)
    assert not facts["parent_flags"]["PORTABLE"] and facts["parent_flags"]["PROC"]
    assert facts["packet_mode"] and facts["second_reader"] and not facts["count_fd"]
    assert facts["task_pipe_size"] == facts["reply_pipe_size"] == 1 << 20  # grown
    assert facts["desk"] and facts["bytes_pipe_sizes"] == [64 << 10] * 2  # shared memory
    assert any(path.startswith("/proc/") and "/fd/" in path
               for path in facts["worker"]["proc_opens"])  # the parent's segments
    assert any(path.startswith("/proc/self/fd/") for path in facts["parent_proc_opens"])
    assert "/proc/self/statm" in facts["worker"]["proc_opens"]  # max_memory_per_child
    assert facts["rss"] is not None and facts["rss"] > 1 << 20


def flags() -> dict[str, bool]:
    return {name: value for name, value in vars(_platform).items() if name.isupper()}


def test_adopting_the_switch_turns_every_flag_off_and_back():
    saved = flags()
    try:
        _platform.adopt(True)
        assert flags() == {**dict.fromkeys(saved, False), "PORTABLE": True}
    finally:
        _platform.adopt(saved["PORTABLE"])
    assert flags() == saved

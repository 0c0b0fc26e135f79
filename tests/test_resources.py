"""When the machine fails, not the task: the system refusing descriptors, processes or
memory, and no room for crash reports.

Every test here is ``isolated`` (a fresh interpreter runs it): it lowers that process's
own limits, or moves it into a process-count cgroup of its own. The facts checked are the
kernel's: a start refused with EMFILE or EAGAIN, descriptors given back, processes gone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import multiprocessing
import os
import resource
import signal
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import pool
from pool import _platform
import tasks
from helpers import open_fds, process_exists, wait_until
from pool._core.start_failures import MAX_REFUSED_STARTS

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[list[int]]:
    """No descriptor can be opened: the soft RLIMIT_NOFILE is one above the highest open
    one, and the numbers below it that are free are taken. Yields the fillers (the test
    may close some); all is given back on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_fds()) + 1, hard))
    fillers: list[int] = []
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield fillers
    finally:
        for fd in fillers:
            with contextlib.suppress(OSError):
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def pids_of_workers(p: pool.ProcessPool) -> set[int]:
    return {w.pid for w in p.stats().workers}


@pytest.mark.isolated
def test_starts_refused_for_want_of_descriptors_fail_the_waiting_task_then_the_pool_recovers(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        worker = p.submit(tasks.pid_of_worker).result(60)
        with descriptors_exhausted():
            os.kill(worker, signal.SIGKILL)
            assert wait_until(lambda: p.stats().starts_refused >= 1, 30)
            error = p.submit(tasks.square, 3).exception(60)
            assert isinstance(error, pool.WorkerStartRefused)
            assert isinstance(error, concurrent.futures.process.BrokenProcessPool)
            assert "RLIMIT_NOFILE" in str(error) and "Too many open files" in str(error)
            assert isinstance(error.__cause__, OSError)
            assert error.__cause__.errno == errno.EMFILE
            stats = p.stats()
            # Tried again with back-off, not in a spin: about MAX_REFUSED_STARTS tries
            # before the task failed.
            assert MAX_REFUSED_STARTS <= stats.starts_refused <= MAX_REFUSED_STARTS + 2
            assert stats.failed == 1
        # The limit is back: the pool starts a worker and runs what is submitted.
        assert p.submit(tasks.square, 4).result(60) == 16
        assert worker not in pids_of_workers(p)
    # (The autouse leak check: every descriptor the refused starts opened was closed.)


@pytest.mark.isolated
def test_a_start_refused_while_another_worker_runs_delays_no_task(ctx):
    with pool.ProcessPool(2, mp_context=ctx) as p:
        first, second = (p.submit(tasks.sleep_then, 0.5, i) for i in range(2))
        assert (first.result(60), second.result(60)) == (0, 1)
        survivor, victim = sorted(pids_of_workers(p))
        with descriptors_exhausted():
            os.kill(victim, signal.SIGKILL)
            assert wait_until(lambda: p.stats().starts_refused >= 1, 30)
            results = [p.submit(tasks.pid_of_worker).result(60) for _ in range(40)]
            assert set(results) == {survivor}
            assert p.stats().failed == 0
        assert wait_until(lambda: len(pids_of_workers(p)) == 2, 30)  # the slot is refilled


def _pids_cgroups() -> Path | None:
    """Where this process may make a pids cgroup (v1, or v2 with the controller enabled)."""
    v1, v2 = Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")
    if (v1 / "cgroup.procs").exists():
        base = v1
    elif (v2 / "cgroup.subtree_control").exists() and "pids" in (
            v2 / "cgroup.subtree_control").read_text().split():
        base = v2
    else:
        return None
    return base if os.access(base, os.W_OK) else None


@contextlib.contextmanager
def process_count_limited() -> Iterator[Path]:
    """This process (and every process it starts from now on) in a pids cgroup of its
    own; the test writes its ``pids.max``. Once it is below the count, the kernel refuses
    fork() with EAGAIN, as RLIMIT_NPROC does (which does not bind root). Everything in
    it goes back to the parent cgroup on exit."""
    base = _pids_cgroups()
    assert base is not None
    group = base / f"pool-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (base / "cgroup.procs").write_text(pid)
        wait_until(lambda: not (group / "cgroup.procs").read_text().split(), 10)
        group.rmdir()


@pytest.mark.isolated
@pytest.mark.skipif(_pids_cgroups() is None, reason="no pids cgroup this process may write")
def test_forks_refused_for_want_of_processes_are_retried_and_explained(ctx):
    from multiprocessing import forkserver
    with process_count_limited() as group:
        forkserver._forkserver._stop()  # the next one starts in the cgroup, and is limited
        with pool.ProcessPool(2, mp_context=ctx) as p:
            first, second = (p.submit(tasks.sleep_then, 0.5, i) for i in range(2))
            assert (first.result(60), second.result(60)) == (0, 1)
            survivor, victim = sorted(pids_of_workers(p))
            (group / "pids.max").write_text("1")
            os.kill(victim, signal.SIGKILL)
            assert wait_until(lambda: p.stats().starts_refused >= 1, 30)
            if ctx.get_start_method() == "forkserver":
                # The fork fails in the forkserver, which then exits (CPython), and the
                # exit status of every worker it started goes with it: the pool ends the
                # survivor, saying why, instead of losing track of it.
                assert wait_until(lambda: not process_exists(survivor), 30)
                error = p.submit(tasks.square, 3).exception(60)
                assert isinstance(error, pool.WorkerStartRefused)
            else:  # the survivor runs everything meanwhile
                results = {p.submit(tasks.pid_of_worker).result(60) for _ in range(20)}
                assert results == {survivor}
            (group / "pids.max").write_text("max")
            assert p.submit(tasks.square, 4).result(60) == 16
        forkserver._forkserver._stop()


@pytest.mark.isolated
def test_a_worker_whose_forkserver_exits_is_ended_with_the_reason(tmp_path):
    from multiprocessing import forkserver
    ctx = multiprocessing.get_context("forkserver")
    try:
        with pool.ProcessPool(1, mp_context=ctx) as p:
            p.submit(tasks.square, 2).result(60)
            (worker,) = pids_of_workers(p)
            running = p.submit(tasks.started_then, str(tmp_path), 0, "wait")
            # Started in the worker, not only sent: a task the worker had not read when it
            # was killed would rightly run again on the next worker (seen under load).
            assert wait_until(lambda: tasks.started_inputs(str(tmp_path)) == {0: worker}, 30)
            os.kill(forkserver._forkserver._forkserver_pid, signal.SIGKILL)
            error = running.exception(60)
            assert isinstance(error, pool.WorkerDied)
            assert "forkserver that started it had exited" in str(error)
            # SIGKILLed as its task failed; not the pool's child (the forkserver's), so
            # gone a moment later. (Without /proc, nothing slows the pool down enough to
            # see it.)
            assert wait_until(lambda: not process_exists(worker), 10)
            assert p.submit(tasks.square, 3).result(60) == 9  # a new forkserver and worker
    finally:
        forkserver._forkserver._stop()  # (the new one holds descriptors the old one did not)


def _address_space_limited(extra: int) -> None:
    """RLIMIT_AS at what this process maps now, plus ``extra`` bytes."""
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, resource.RLIM_INFINITY))


@pytest.mark.isolated
def test_out_of_memory_while_pickling_a_call_fails_that_call_only(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        assert p.submit(tasks.square, 2).result(60) == 4
        # A 64 MiB mutable buffer, which submit() copies (so that later changes do not
        # change the task), with room for 8 MiB more. (One buffer: so large a block is
        # always mapped anew, never taken from memory the heap already holds.)
        buffers = [bytearray(64 << 20)]
        _address_space_limited(8 << 20)
        try:
            error = p.submit(len, buffers).exception(0)  # (failed at once: nothing was sent)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
        assert isinstance(error, pool.ArgumentPicklingError)
        assert "MemoryError (out of memory)" in str(error)
        assert isinstance(error.__cause__, MemoryError)
        assert p.submit(tasks.square, 3).result(60) == 9


@pytest.mark.isolated
def test_a_reply_the_parent_has_no_memory_for_fails_that_task_and_the_worker_goes_on(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        worker = p.submit(tasks.pid_of_worker).result(60)
        _address_space_limited(150 << 20)
        try:
            error = p.submit(tasks.make_bytes, 300 << 20).exception(60)
            after = p.submit(tasks.pid_of_worker).result(60)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
        assert isinstance(error, pool.ResultTransferError)
        assert "no memory for a reply of 314572" in str(error)
        assert isinstance(error.__cause__, MemoryError)
        assert after == worker  # its reply was read to the end and dropped: it goes on
        assert p.stats().worker_deaths == 0


@pytest.mark.isolated
@pytest.mark.skipif(not _platform.MEMFD, reason="no memfd_create here (or POOL_PORTABLE)")
def test_crash_reports_need_no_temp_directory(ctx):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        p.submit(tasks.square, 2).result(60)  # (the forkserver has made its socket)
        tempfile.tempdir = "/proc/self"  # nothing can be created there, even by root
        try:
            p.submit(tasks.sigkill_self).exception(60)  # the next worker starts now
            error = p.submit(tasks.segfault).exception(60)
            assert p.submit(tasks.square, 3).result(60) == 9
        finally:
            tempfile.tempdir = None
    assert isinstance(error, pool.WorkerDied)
    assert "in segfault" in error.crash_report  # the stack, as ever


@pytest.mark.isolated
def test_without_a_crash_file_tasks_run_and_deaths_are_explained(ctx, monkeypatch):
    monkeypatch.setattr(_platform, "MEMFD", False)  # a temp file it must be, then
    with pool.ProcessPool(1, mp_context=ctx) as p:
        p.submit(tasks.square, 2).result(60)
        tempfile.tempdir = "/proc/self"
        try:
            p.submit(tasks.sigkill_self).exception(60)  # the next worker starts now
            assert [p.submit(tasks.square, i).result(60) for i in range(3)] == [0, 1, 4]
            error = p.submit(tasks.segfault).exception(60)
            assert p.submit(tasks.square, 3).result(60) == 9
        finally:
            tempfile.tempdir = None
    assert isinstance(error, pool.WorkerDied) and error.signal_name == "SIGSEGV"
    assert "none: the pool could not create a file for it in /proc/self" in str(error)

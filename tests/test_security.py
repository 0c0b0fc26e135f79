"""What the security review (docs/guide/security.rst) claims, where it can be checked: no
sockets, crash reports private and never on disk, and what a worker inherits under each
start method."""

from __future__ import annotations

import os
import stat

import pytest

import pool
from pool import _platform
import tasks

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


def descriptors_of(pid: int) -> dict[int, str]:
    """What each open descriptor of ``pid`` is (``socket:[...]``, ``pipe:[...]``, a path)."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass  # closed meanwhile
    return found


def sockets_of(pid: int) -> list[str]:
    return [what for what in descriptors_of(pid).values() if what.startswith("socket:")]


def test_no_socket_is_opened_by_the_pool_or_its_workers(ctx):
    before = sockets_of(os.getpid())
    with pool.ProcessPool(2, mp_context=ctx) as p:
        results = [p.submit(tasks.pid_of_worker) for _ in range(20)]
        workers = {f.result(60) for f in results}
        assert sockets_of(os.getpid()) == before  # (pipes only, between it and its own)
        for worker in workers:
            assert sockets_of(worker) == []
            assert any(what.startswith("pipe:") for what in descriptors_of(worker).values())


# A worker's files shared with the parent: its crash report, and where a pool.Pool chunk
# records its items (_worker.progress). Each an attribute of its handle, and a memfd name.
SHARED_FILES = [("crash_fd", "pool-crash-report"), ("progress_fd", "pool-progress")]


def shared_files(p: pool.ProcessPool, attribute: str) -> list[str]:
    handles = list(p._dispatcher._loop._workers.values())
    return [os.readlink(f"/proc/self/fd/{getattr(h, attribute)}") for h in handles
            if getattr(h, attribute) is not None]


@pytest.mark.skipif(not _platform.MEMFD, reason="no memfd_create here (or POOL_PORTABLE)")
@pytest.mark.parametrize("attribute, memfd_name", SHARED_FILES)
def test_crash_reports_are_anonymous_memory_never_a_file_on_disk(ctx, attribute, memfd_name):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        worker = p.submit(tasks.pid_of_worker).result(60)
        (name,) = shared_files(p, attribute)
        assert name.startswith(f"/memfd:{memfd_name}") and name.endswith("(deleted)")
        assert any(what == name for what in descriptors_of(worker).values())


@pytest.mark.isolated
@pytest.mark.parametrize("attribute", [attribute for attribute, _ in SHARED_FILES])
def test_without_memfd_a_crash_report_is_a_private_file_unlinked_at_once(ctx, monkeypatch,
                                                                         attribute):
    monkeypatch.setattr(_platform, "MEMFD", False)
    with pool.ProcessPool(1, mp_context=ctx) as p:
        p.submit(tasks.square, 2).result(60)
        (handle,) = p._dispatcher._loop._workers.values()
        fd = getattr(handle, attribute)
        assert fd is not None
        assert os.readlink(f"/proc/self/fd/{fd}").endswith("(deleted)")
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600  # the user's only


def test_a_worker_inherits_the_parents_descriptors_only_under_fork(ctx, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x")
    with open(secret) as held:  # (not inheritable, as Python opens every file)
        with pool.ProcessPool(1, mp_context=ctx) as p:
            worker = p.submit(tasks.pid_of_worker).result(60)
            inherited = str(secret) in descriptors_of(worker).values()
    assert held.closed
    # fork copies every descriptor of the parent; spawn and forkserver pass only the
    # worker's own pipes, crash report and lifeline.
    assert inherited == (ctx.get_start_method() == "fork")

"""Large payloads through shared memory (``pool/_wire/segments.py`` and its siblings): what travels there and
how it arrives, what the caller and the task may keep, and that deaths, timeouts and
floods leave nothing behind. Where the platform has no shared memory for pool
(``POOL_PORTABLE=1``, not Linux), the same tests check the pipe path instead."""

from __future__ import annotations

import os
import pickle
import zlib

import pytest

import pool
import tasks
from helpers import START_METHODS, full_volume, run_script, wait_until
from pool import _platform
from pool._wire import frames as _frames, payloads, pickling as _pickling, segments, shared_calls

MiB = 1 << 20
# What a buffer arrives as: a view of a segment, or a copy out of the pipe.
ARRIVES_AS = "mmap" if _platform.SHARED_MEMORY else "bytearray"


def crc(data: object) -> int:
    return zlib.crc32(data)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", START_METHODS)
def test_a_buffer_arrives_without_a_copy_and_comes_back_as_one(method):
    import multiprocessing
    with pool.ProcessPool(2, mp_context=multiprocessing.get_context(method)) as p:
        sent = tasks.blob(MiB, 3)
        assert p.submit(tasks.blob_facts, sent).result() == (ARRIVES_AS, MiB, crc(sent.data))
        back = p.submit(tasks.blob, MiB, 5).result()
        assert type(memoryview(back.data).obj).__name__ == ARRIVES_AS
        assert bytes(back.data) == bytes([5]) * MiB
        # Small ones stay in the stream, as ever.
        assert p.submit(tasks.blob_facts, tasks.blob(1000)).result()[0] == "bytearray"


def test_bytes_and_bytearrays_arrive_as_themselves_both_ways():
    with pool.ProcessPool(1) as p:
        big = os.urandom(3 * MiB)
        mutable = bytearray(big)
        assert p.submit(tasks.payload_facts, big).result() == ("bytes", len(big), crc(big))
        assert p.submit(tasks.payload_facts, mutable).result() == (
            "bytearray", len(big), crc(big))
        back = p.submit(tasks.identity, [big, mutable, "small"]).result()
        assert back == [big, mutable, "small"]
        assert type(back[0]) is bytes and type(back[1]) is bytearray


def test_a_buffer_changed_after_submit_does_not_change_the_task():
    with pool.ProcessPool(1) as p:
        mutable = bytearray(b"a") * (2 * MiB)
        sent = tasks.blob(2 * MiB, 1)
        futures = [p.submit(tasks.payload_facts, mutable), p.submit(tasks.blob_facts, sent)]
        expected = [crc(mutable), crc(sent.data)]
        mutable[:] = b"b" * len(mutable)  # after submit: the tasks got what was submitted
        sent.data[:] = b"\0" * len(sent.data)
        assert [f.result()[2] for f in futures] == expected


@pytest.mark.parametrize("method", START_METHODS)
def test_a_view_the_task_keeps_is_never_written_again(method):
    import multiprocessing
    with pool.ProcessPool(1, mp_context=multiprocessing.get_context(method)) as p:
        kept = tasks.blob(MiB, 9)
        expected = p.submit(tasks.keep_blob, kept).result()
        # Later calls, each of which could reuse the segment the worker still views.
        for fill in range(10, 20):
            assert p.submit(tasks.blob_facts, tasks.blob(MiB, fill)).result()[0] == ARRIVES_AS
        assert p.submit(tasks.kept_checksums).result() == [expected] == [crc(kept.data)]


def test_a_result_the_caller_holds_is_never_written_again_and_one_let_go_is_reused():
    with pool.ProcessPool(1) as p:
        held = p.submit(tasks.blob, MiB, 1).result()
        for fill in range(2, 40):
            assert p.submit(tasks.blob, MiB, fill).result().data[0] == fill
        assert bytes(held.data) == bytes([1]) * MiB
        if _platform.SHARED_MEMORY:
            # The results let go of were reused: a handful of segments, not forty.
            assert segments.cache.count <= 6, segments.cache.count
        else:
            assert segments.cache.count == 0


@pytest.mark.parametrize("method", START_METHODS)
def test_a_large_result_sent_before_death_is_delivered(method):
    import multiprocessing
    with pool.ProcessPool(1, mp_context=multiprocessing.get_context(method)) as p:
        back = p.submit(tasks.blob_then_die, MiB).result()
        assert bytes(back.data) == bytes([7]) * MiB
        assert p.submit(tasks.square, 4).result() == 16


def test_a_result_envelope_outside_its_segment_fails_the_task_and_replaces_the_worker():
    with pool.ProcessPool(1) as p:
        with pytest.raises(pool.WorkerProtocolError, match="not a reply"):
            p.submit(tasks.write_bad_segment_result).result()
        assert p.submit(tasks.blob_facts, tasks.blob(MiB, 2)).result()[0] == ARRIVES_AS


def test_an_envelope_is_checked_before_any_of_it_is_trusted():
    good = payloads.envelope(1, 2, 3, 4, [(memoryview(b"x" * 10), 0)], [64])
    assert payloads.read_envelope(good, 100)[1] == [(64, 10, 0)]
    for bad, limit in [(good, 70), (good[:-3], 100), (good[:10], 100),
                       (good[:-1] + bytes([9]), 100)]:  # (no such kind)
        with pytest.raises(_frames.MalformedFrame):
            payloads.read_envelope(bad, limit)


def test_large_payloads_go_through_the_pipe_when_no_segment_may_be_had(monkeypatch):
    monkeypatch.setattr(segments, "MAX_SEGMENTS", 0)
    with pool.ProcessPool(1) as p:
        sent = tasks.blob(MiB, 4)
        assert p.submit(tasks.blob_facts, sent).result() == ("bytearray", MiB, crc(sent.data))
        assert bytes(p.submit(tasks.blob, MiB, 6).result().data) == bytes([6]) * MiB
    assert segments.cache.count == 0


def test_without_shared_memory_large_payloads_take_the_pipe(monkeypatch):
    monkeypatch.setattr(_platform, "SHARED_MEMORY", False)
    parts = _pickling.dumps_arguments(len, (tasks.blob(MiB),), {})
    assert not any(type(part) is shared_calls.SharedRef for part in parts)
    (sent,), _ = pickle.loads(b"".join(parts))
    assert len(sent.data) == MiB


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: segments")
def test_a_call_holds_its_segment_until_it_ends_and_gives_it_back_after():
    before = segments.cache.count
    parts = _pickling.dumps_arguments(len, (tasks.blob(MiB),), {})
    (ref,) = [part for part in parts if type(part) is shared_calls.SharedRef]
    assert segments.cache.count == before + 1 and ref.segment.size >= MiB
    del parts, ref  # no dispatcher runs: it is closed at once
    assert segments.cache.count == before


@pytest.mark.parametrize("method", START_METHODS)
def test_deaths_timeouts_and_floods_leave_no_segment_and_no_mapping(method, tmp_path):
    deaths = 1000 if full_volume(method) else 150
    facts, _ = run_script(f"""
        from pool._wire import segments
        def fds():
            return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
        def mapped():  # bytes of segments this process maps
            total = 0
            if os.path.exists("/proc/self/maps"):
                with open("/proc/self/maps") as maps:
                    for line in maps:
                        if "pool-segment" in line:
                            start, end = line.split()[0].split("-")
                            total += int(end, 16) - int(start, 16)
            return total
        # Their descriptors are multiprocessing's, for good, not the pool's.
        __import__("multiprocessing.resource_tracker").resource_tracker.ensure_running()
        if METHOD == "forkserver":
            __import__("multiprocessing.forkserver").forkserver.ensure_running()
        shm_before = sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else []
        fds_before = fds()
        most_segments = most_mapped = 0
        with pool.ProcessPool(2, mp_context=CTX) as p:
            for i in range({deaths}):
                sent = tasks.blob(300 << 10, i % 250)
                try:
                    p.submit(tasks.die_holding if i % 2 else tasks.blob_then_die,
                             sent if i % 2 else 300 << 10).result()
                except pool.WorkerDied:
                    pass
                most_segments = max(most_segments, segments.cache.count)
                most_mapped = max(most_mapped, mapped())
            for _ in range(3):  # a timeout while viewing its argument
                try:
                    p.schedule(tasks.sleep_then, (30, tasks.blob(1 << 20)), timeout=0.2).result()
                except pool.TaskTimeout:
                    pass
            # A flood: more calls queued than there may be segments, behind two that wait.
            gate = os.path.join(os.getcwd(), "gate")
            waiting = [p.submit(tasks.wait_for_file, gate) for _ in range(2)]
            flood = [p.submit(tasks.blob_facts, tasks.blob(300 << 10, i % 250))
                     for i in range(segments.MAX_SEGMENTS + 100)]
            flooded = segments.cache.count
            open(gate, "w").close()
            sums = [f.result()[2] for f in flood]
            [f.result() for f in waiting]
            assert p.submit(tasks.square, 5).result() == 25
        report(most_segments=most_segments, most_mapped=most_mapped, flooded=flooded,
               sums_ok=sums == [tasks.checksum(bytes([i % 250]) * (300 << 10))
                                for i in range(len(flood))],
               after_segments=segments.cache.count, after_mapped=mapped(),
               fds_left=fds() - fds_before,
               # (Named semaphores, and joblib's memory-mapping folders, are other
               # programs' on a shared machine: CI runs joblib's suite beside this one.
               # pool makes no file there, a segment least of all.)
               shm_new=sorted(name for name in set(os.listdir("/dev/shm")) - set(shm_before)
                              if not name.startswith(("sem.", "joblib_memmapping_folder_",
                                                      "loky-")))
                       if os.path.isdir("/dev/shm") else [])
    """, method, tmp_path, timeout=600)
    assert facts["sums_ok"] is True
    # Bounded throughout: the segments in use by two workers and those just let go of
    # (reused before any new one is made), not one per death.
    assert facts["most_segments"] <= 16, facts
    assert facts["flooded"] == (segments.MAX_SEGMENTS if _platform.SHARED_MEMORY else 0), facts
    # Nothing left: no segment, no mapping, no descriptor, no file in /dev/shm.
    assert facts["after_segments"] == 0 and facts["after_mapped"] == 0, facts
    assert facts["fds_left"] <= 0 and facts["shm_new"] == [], facts
    assert facts["children_left"] == [] and facts["threads_left"] == []


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: forks")
def test_a_view_a_task_forked_with_is_never_written_again(tmp_path):
    gate, path = str(tmp_path / "gate"), str(tmp_path / "seen")
    with pool.ProcessPool(1, mp_context=__import__("multiprocessing").get_context("fork")) as p:
        p.submit(tasks.fork_viewing, tasks.blob(MiB, 1), gate, path).result()
        for fill in range(2, 12):  # calls that could reuse the segment the child views
            p.submit(tasks.blob_facts, tasks.blob(MiB, fill)).result()
        open(gate, "w").close()
        assert wait_until(lambda: os.path.exists(path), 60)
    with open(path) as seen:
        assert seen.read() == "same"


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: forks")
def test_a_view_a_task_forked_with_stays_so_when_its_worker_is_killed(tmp_path):
    gate, path = str(tmp_path / "gate"), str(tmp_path / "seen")
    with pool.ProcessPool(1, mp_context=__import__("multiprocessing").get_context("fork")) as p:
        with pytest.raises(pool.TaskTimeout):
            p.schedule(tasks.fork_viewing_then_hang, (tasks.blob(MiB, 1), gate, path),
                       timeout=1).result()
        for fill in range(2, 12):
            p.submit(tasks.blob_facts, tasks.blob(MiB, fill)).result()
        open(gate, "w").close()
        assert wait_until(lambda: os.path.exists(path), 60)  # (it left the worker's group)
    with open(path) as seen:
        assert seen.read() == "same"


def test_a_program_whose_segments_workers_may_not_open_sends_through_the_pipe(tmp_path):
    facts, _ = run_script("""
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: /proc/PID/fd closed
        with pool.ProcessPool(1, mp_context=CTX) as p:
            sent = tasks.blob(1 << 20, 5)
            facts = p.submit(tasks.blob_facts, sent).result(60)
        report(arrived_as=facts[0], size=facts[1])
    """, "forkserver", tmp_path)
    assert facts == {"arrived_as": "bytearray", "size": MiB, "children_left": [],
                     "threads_left": []}


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: loans")
def test_a_result_over_pages_never_written_fails_its_task_and_the_parent_allocates_none():
    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with pool.ProcessPool(1) as p:
        before = rss()
        with pytest.raises(pool.WorkerProtocolError, match="never all written"):
            p.submit(tasks.write_sparse_segment_result, 1 << 30).result()
        assert rss() - before < 100 << 20  # not the gigabyte the envelope claimed
        assert bytes(p.submit(tasks.blob, MiB, 3).result().data) == bytes([3]) * MiB


def test_the_same_large_object_arrives_as_one_object_both_ways():
    with pool.ProcessPool(1) as p:
        big = os.urandom(MiB)
        same, back = p.submit(tasks.same_object, (big, big)).result()
        assert same and back[0] is back[1] and back[0] == big


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: loans")
def test_a_worker_lent_nothing_when_none_could_be_had_is_lent_one_later(monkeypatch):
    monkeypatch.setattr(segments, "MAX_SEGMENTS", 0)
    with pool.ProcessPool(1) as p:
        first = p.submit(tasks.blob, MiB, 1).result()
        assert type(memoryview(first.data).obj).__name__ == "bytearray"  # the pipe
        monkeypatch.setattr(segments, "MAX_SEGMENTS", 256)
        p.submit(tasks.square, 2).result()  # its reply: the worker is lent a segment now
        later = p.submit(tasks.blob, MiB, 2).result()
        assert type(memoryview(later.data).obj).__name__ == "mmap"


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: idle segments")
def test_idle_segments_go_back_to_the_system_while_the_pool_stays_open(monkeypatch):
    monkeypatch.setattr(segments, "IDLE_SECONDS", 0.2)
    with pool.ProcessPool(1) as p:
        for fill in range(5):
            p.submit(tasks.blob_facts, tasks.blob(MiB, fill)).result()
        for fill in range(3):  # results: the worker's loan then holds memory
            p.submit(tasks.blob, MiB, fill).result()
        # What is left is the worker's loan, taken back and replaced by an empty one while
        # the worker is idle: no idle segment, no memory held, however long the pool waits.
        (worker,) = p._dispatcher._loop._workers.values()
        # (Read from this thread while the dispatcher works: a loan may be between hands.)
        assert wait_until(lambda: (loan := worker.desk.loan) is not None and loan.size == 0,
                          10)
        assert wait_until(lambda: segments.cache.idle_bytes() == 0, 10)
        assert wait_until(lambda: segments.cache.count <= 1, 10), segments.cache.count
        # And the worker still gets its large results through shared memory.
        back = p.submit(tasks.blob, MiB, 9).result()
        assert type(memoryview(back.data).obj).__name__ == "mmap"


@pytest.mark.skipif(not _platform.SHARED_MEMORY, reason="shared memory only: fork and views")
def test_a_forked_child_never_sees_a_result_its_parent_let_go_of_change(tmp_path):
    facts, _ = run_script("""
        with pool.ProcessPool(1, mp_context=CTX) as p:
            held = p.submit(tasks.blob, 1 << 20, 1).result()
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
            child = os.fork()
            if child == 0:
                os.write(ready_w, b"x")
                os.read(go_r, 1)  # the parent has let go of its view and made more
                os._exit(0 if bytes(held.data) == bytes([1]) * (1 << 20) else 1)
            os.read(ready_r, 1)
            del held
            for fill in range(2, 12):
                p.submit(tasks.blob, 1 << 20, fill).result()
            os.write(go_w, b"x")
            _, status = os.waitpid(child, 0)
        report(child_saw_its_copy=os.waitstatus_to_exitcode(status) == 0)
    """, "forkserver", tmp_path)
    assert facts["child_saw_its_copy"] is True

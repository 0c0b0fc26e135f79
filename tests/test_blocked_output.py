"""The program's own standard output, blocked (a full pipe nobody reads, a paused pager)
while one of its threads is in the middle of writing to it, holds up neither the pool's
thread, which starts workers, nor a forked worker, which inherits that stream with its
lock taken by a thread the child does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from helpers import START_METHODS, TESTS_DIR, wait_until

SCRIPT = textwrap.dedent("""
    import array, fcntl, json, multiprocessing, os, sys, termios, threading, time
    import pool
    from helpers import wait_until

    def unread_bytes(fd):   # Linux answers FIONREAD on a pipe's write end
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return count[0]

    def warm_up(n):
        time.sleep(0.3)
        return n

    def square(n):
        print(f"worker output {n}", flush=True)   # (a worker's own output still works)
        return n * n

    if __name__ == "__main__":
        method, result_path, started_path = sys.argv[1:]
        def chatter():
            sys.stdout.write("x" * (1 << 20))   # the pipe fills; nobody reads it yet
            sys.stdout.flush()
        facts = {}
        try:
            with pool.ProcessPool(2, mp_context=multiprocessing.get_context(method)) as p:
                # (Its first use flushes stdout in this thread, as the stdlib's starts do:
                # before the pipe is blocked.)
                assert p.submit(warm_up, -1).result(timeout=30) == -1
                threading.Thread(target=chatter, daemon=True).start()
                capacity = fcntl.fcntl(1, 1032)   # F_GETPIPE_SZ (Linux): the test's own
                assert wait_until(lambda: unread_bytes(1) >= capacity, 30)
                # The second worker starts while stdout is full, and a thread is in its
                # write (under fork, the worker inherits that stream with its lock taken).
                facts["warm"] = [f.result(timeout=30) for f in
                                 [p.submit(warm_up, n) for n in range(2)]]
                open(started_path, "w").close()   # (the test reads stdout from now on)
                facts["results"] = [f.result(timeout=30) for f in
                                    [p.submit(square, n) for n in range(6)]]
                facts["workers"] = p.stats().workers_started
        except BaseException as exc:
            facts["error"] = f"{type(exc).__name__}: {exc}"
        with open(result_path, "w") as out:
            json.dump(facts, out)
        os._exit(0)   # (without the flush of what the main thread printed)
    """)


@pytest.mark.parametrize("method", START_METHODS)
def test_a_blocked_standard_output_holds_up_no_worker_start(method, tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(SCRIPT)
    result_path, started_path = tmp_path / "facts.json", tmp_path / "started"
    environment = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    environment.pop("PYTHONUNBUFFERED", None)   # (buffered: the stream has a lock)
    read_end, write_end = os.pipe()
    output = bytearray()
    reader = threading.Thread(target=lambda: output.extend(_read_all(read_end)))
    try:
        proc = subprocess.Popen([sys.executable, str(script), method, str(result_path),
                                 str(started_path)], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, env=environment,
                                cwd=str(tmp_path))
        os.close(write_end)
        try:
            # Workers must start with nobody reading stdout; then it is read, so that
            # what the workers print can get through.
            assert wait_until(lambda: started_path.exists() or proc.poll() is not None,
                              60), "no worker started while stdout was blocked"
            reader.start()
            _, errors = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if reader.ident is not None:
            reader.join(30)
    finally:
        os.close(read_end)
    facts = json.loads(result_path.read_text())
    assert facts == {"warm": [0, 1], "results": [0, 1, 4, 9, 16, 25], "workers": 2}, errors
    # (Each line is one small write, so whole, wherever the other thread's x's are.)
    text = output.decode(errors="replace")
    assert all(f"worker output {n}\n" in text for n in range(6)), errors


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("method", START_METHODS)
def test_what_the_program_printed_before_its_first_task_comes_first(method, tmp_path):
    script = tmp_path / "order.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing
        import pool

        def work(n):
            print("from the worker", flush=True)
            return n

        if __name__ == "__main__":
            print("before the pool")   # (buffered: stdout is a pipe)
            with pool.ProcessPool(1, mp_context=multiprocessing.get_context({method!r})) as p:
                p.submit(work, 1).result(60)
            print("after")
        """))
    environment = dict(os.environ)
    environment.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env=environment, cwd=str(tmp_path))
    assert proc.stdout == "before the pool\nfrom the worker\nafter\n", proc.stderr

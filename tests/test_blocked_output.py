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

import pytest

from helpers import START_METHODS, TESTS_DIR

SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, sys, threading
    import pool
    from helpers import wait_until
    from pool import _pipes

    def square(n):
        print("worker output", n)   # (a worker's own output still works)
        return n * n

    if __name__ == "__main__":
        method, result_path = sys.argv[1:]
        def chatter():
            sys.stdout.write("x" * (1 << 20))   # the pipe fills; nobody reads it
            sys.stdout.flush()
        threading.Thread(target=chatter, daemon=True).start()
        capacity = _pipes.pipe_capacity(1)
        assert wait_until(lambda: _pipes.unread_bytes(1) >= capacity, 30)
        facts = {}
        try:
            with pool.ProcessPool(2, mp_context=multiprocessing.get_context(method)) as p:
                facts["results"] = [f.result(timeout=30) for f in
                                    [p.submit(square, n) for n in range(6)]]
                facts["workers"] = p.stats().workers_started
        except BaseException as exc:
            facts["error"] = f"{type(exc).__name__}: {exc}"
        with open(result_path, "w") as out:
            json.dump(facts, out)
        os._exit(0)   # (the writer thread is still blocked)
    """)


@pytest.mark.parametrize("method", START_METHODS)
def test_a_blocked_standard_output_holds_up_no_worker_start(method, tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(SCRIPT)
    result_path = tmp_path / "facts.json"
    environment = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    environment.pop("PYTHONUNBUFFERED", None)   # (buffered: the stream has a lock)
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, str(script), method, str(result_path)],
                                stdout=write_end, stderr=subprocess.PIPE, text=True,
                                env=environment, cwd=str(tmp_path))
        os.close(write_end)
        try:
            _, errors = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        os.close(read_end)
    facts = json.loads(result_path.read_text())
    assert facts == {"results": [0, 1, 4, 9, 16, 25], "workers": 2}, errors

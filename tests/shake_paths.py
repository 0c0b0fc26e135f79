"""The paths the shake (``shake.py``) runs: the scripts of pool's Python faces and the
command lines of ``python -m pool map``. A new face adds its path here (the shake's
``PATHS`` then runs it, and the suite's short shake with it).

A script is ``PRELUDE`` followed by its body under ``if __name__ == "__main__":``; it
calls ``begin()`` when the path begins (the signal comes at a random moment after), and
adds every future it makes to ``FUTURES``, which are checked at its last exit hook.
"""

from __future__ import annotations

import sys

# -- the Python paths -------------------------------------------------------------------
# Every script starts with this. The check of the futures is registered before pool is
# imported, so it runs after pool's own exit hook (atexit runs its functions last in,
# first out; pool's runs before threads are joined, earlier still).
PRELUDE = '''
import asyncio, atexit, multiprocessing, os, random, sys, time
sys.path[:0] = [{tests!r}]
import tasks
FUTURES = []
def _check_futures():
    pending = sum(1 for f in FUTURES if not f.done())
    os.write(1, f"FUTURES {{len(FUTURES)}} {{pending}}\\n".encode())
if __name__ == "__main__":   # (not in a process that imports it as __mp_main__)
    atexit.register(_check_futures)
import pool
CTX = multiprocessing.get_context(os.environ["SHAKE_METHOD"])
# Every path ends with a task this long: far past the exit bound, so that a signal the
# program lost shows as a hang, not as a program that finished.
LONG = 600
def begin():
    os.write(1, b"BEGIN\\n")
'''

SCRIPTS = {
    "submit": '''
p = pool.ProcessPool(2, mp_context=CTX)
p.submit(abs, 0).result()
begin()
for i in range(3000):
    FUTURES.append(p.submit(abs, -i))
FUTURES.append(p.submit(tasks.sleep_then, LONG))
for f in FUTURES:
    f.result()
p.shutdown()
''',
    "result": '''
with pool.ProcessPool(2, mp_context=CTX) as p:
    FUTURES.extend(p.submit(tasks.sleep_then, 0.01, i) for i in range(60))
    FUTURES.append(p.submit(tasks.sleep_then, LONG))
    begin()
    for f in FUTURES:
        f.result()
''',
    "map": '''
with pool.ProcessPool(2, mp_context=CTX) as p:
    p.submit(abs, 0).result()
    begin()
    for _ in p.map(tasks.sleep_then, [0.01] * 60 + [LONG]):
        pass
''',
    "shutdown": '''
p = pool.ProcessPool(2, mp_context=CTX)
FUTURES.extend(p.submit(tasks.sleep_then, 0.01, i) for i in range(60))
FUTURES.append(p.submit(tasks.sleep_then, LONG))
begin()
p.shutdown(wait=True)
''',
    "with-exit": '''
with pool.ProcessPool(2, mp_context=CTX) as p:
    FUTURES.extend(p.submit(tasks.sleep_then, 0.01, i) for i in range(60))
    FUTURES.append(p.submit(tasks.sleep_then, LONG))
    begin()
''',
    "interpreter-exit": '''
p = pool.ProcessPool(2, mp_context=CTX)   # never shut down: the exit hook does it
FUTURES.extend(p.submit(tasks.sleep_then, 0.01, i) for i in range(60))
FUTURES.append(p.submit(tasks.sleep_then, LONG))
begin()
''',
    "asyncio-cancel": '''
async def main():
    async with pool.ProcessPool(2, mp_context=CTX) as p:
        async def one(i):
            future = p.submit(tasks.sleep_then, 0.02, i)
            FUTURES.append(future)
            return await asyncio.wrap_future(future)
        running = [asyncio.ensure_future(one(i)) for i in range(40)]
        running.append(asyncio.ensure_future(p.run(tasks.sleep_then, LONG)))
        begin()
        await asyncio.sleep(random.random() * 0.3)
        for task in running[::3]:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
asyncio.run(main())
''',
    # A program written for the stdlib's executor, run by ``python -m pool run``.
    "pool-run": '''
import concurrent.futures
with concurrent.futures.ProcessPoolExecutor(2, mp_context=CTX) as p:
    if not type(p).__module__.startswith("pool"):
        sys.exit(f"not swapped: {type(p)}")
    FUTURES.extend(p.submit(tasks.sleep_then, 0.01, i) for i in range(60))
    FUTURES.append(p.submit(tasks.sleep_then, LONG))
    begin()
    for f in concurrent.futures.as_completed(FUTURES):
        f.result()
''',
    # pool.Pool, the multiprocessing.Pool face: results of apply_async and map_async, then
    # imap over a generator, as its users write it.
    "mp-pool": '''
class _Ready:   # the check at exit asks done(); a result says ready()
    def __init__(self, result):
        self.done = result.ready
with pool.Pool(2, context=CTX) as p:
    p.apply(abs, (0,))
    results = [p.apply_async(tasks.sleep_then, (0.01, i)) for i in range(40)]
    results.append(p.map_async(abs, range(-200, 0), chunksize=7))
    results.append(p.apply_async(tasks.sleep_then, (LONG,)))
    FUTURES.extend(_Ready(result) for result in results)
    begin()
    for _ in p.imap(tasks.sleep_then, (0.01 for _ in range(30))):
        pass
    for result in results:
        result.get()
''',
    # A program written for the stdlib's multiprocessing.Pool, run by ``python -m pool run``.
    "mp-pool-run": '''
import multiprocessing.pool
class _Ready:
    def __init__(self, result):
        self.done = result.ready
with CTX.Pool(2) as p:
    if not type(p).__module__.startswith("pool"):
        sys.exit(f"not swapped: {type(p)}")
    results = [p.apply_async(tasks.sleep_then, (0.01, i)) for i in range(40)]
    results.append(p.apply_async(tasks.sleep_then, (LONG,)))
    FUTURES.extend(_Ready(result) for result in results)
    begin()
    for result in results:
        result.get()
''',
    # pool as the executor of a dask worker (``pool.dask``; needs distributed): the worker
    # in this process, so that the pool's parent is the program the signal reaches.
    "dask": '''
from distributed import Client, LocalCluster
from pool.dask import ProcessPoolPlugin
with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                  dashboard_address=None) as cluster, Client(cluster) as client:
    client.register_plugin(ProcessPoolPlugin(max_workers=2,
                                             start_method=os.environ["SHAKE_METHOD"]))
    client.submit(abs, -1).result()
    futures = client.map(tasks.sleep_then, [0.01] * 60 + [LONG], range(61))
    begin()
    client.gather(futures)
''',
}

# -- the command line's paths -----------------------------------------------------------
# ``python -m pool map`` between a producer and, for ``map-head``, ``head -n 1``.
COMMANDS = {
    # Reading its input: a producer that writes a line every 10 ms, quick inputs.
    "map-read": ("tasks:identity", [], False),
    # Slow inputs (50 ms each), the output read as it comes: a signal after the first line
    # is the scenario of issue 26, once seen still running 20 s after SIGINT.
    "map-slow": ("tasks:slow_echo", [], False),
    # Blocked writing: fast inputs, and the harness stops reading after the first line.
    "map-write": ("tasks:identity", [], False),
    # Behind ``| head -n 1``.
    "map-head": ("tasks:slow_echo", [], True),
    # With a job log, which must stay well-formed whatever ends the run.
    "map-joblog": ("tasks:slow_echo", ["--joblog", "{dir}/joblog"], False),
}

# The paths of every face pool has; ``dask`` only where distributed is installed (tox's
# dask environment runs it).
PATHS = tuple(path for path in SCRIPTS if path != "dask") + tuple(COMMANDS)

SLOW_PRODUCER = [sys.executable, "-c", "import sys, time\n"
                 "for i in range(100000): print(i, flush=True); time.sleep(0.01)"]

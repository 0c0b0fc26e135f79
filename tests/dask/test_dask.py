"""pool.dask on a real ``distributed.LocalCluster`` (nanny and worker processes).

Each scenario runs in a child interpreter of its own, in a session of its own, under a hard
timeout; after it ends the test checks that no process of that session is left (nanny,
dask worker, pool workers, forkserver). Tasks and script meet through files, not sleeps.
Run by tox's ``dask`` environment (``pip install pool[dask]``), not the core matrix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO_DIR, START_METHODS, session_members, wait_until

pytest.importorskip("distributed", reason="pool.dask's tests need pip install pool[dask]")

HERE = Path(__file__).resolve().parent
PRELUDE = (HERE / "dask_scenario.py").read_text()


# Every test gets 180 s; a scenario, less, so that its own timeout reports what it did.
pytestmark = pytest.mark.timeout(180)


def run(body: str, tmp_path: Path, method: str = "forkserver", *, timeout: float = 100
        ) -> dict[str, Any]:
    """Run a scenario script; return what it passed to ``report()``, once every process
    of its session is confirmed gone."""
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + "\n\nif __name__ == '__main__':\n"
                      + textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, POOL_TEST_START_METHOD=method, PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 6)  # faulthandler writes every thread's stack
        out, err = proc.communicate()
        pytest.fail(f"the scenario did not end in {timeout} s\n{out}\n{err[-8000:]}")
    finally:
        left_behind = wait_until(lambda: not session_members(proc.pid), 15)
        if not left_behind:
            for pid in session_members(proc.pid):
                os.kill(pid, 9)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err[-8000:]}"
    assert left_behind, f"processes left behind: {session_members(proc.pid)}"
    reports = [line[len("REPORT "):] for line in out.splitlines() if line.startswith("REPORT ")]
    assert reports, f"no report\n{out}\n{err[-8000:]}"
    facts: dict[str, Any] = json.loads(reports[-1])
    facts["stderr"] = err
    return facts


FAULT_SCENARIO = """
options = {"task_timeout": 4} if KIND == "timeout" else {}
with cluster() as c, Client(c) as client:
    client.register_plugin(ProcessPoolPlugin(start_method=START_METHOD, **options))
    worker_pid = list(client.run(os.getpid).values())[0]
    # (Under a task timeout the bystanders end once the fault has begun: the timeout
    # applies to them too.)
    until = "fault-pid" if KIND == "timeout" else "fault-done"
    bystanders = [client.submit(bystander, i, until, pure=False) for i in range(2)]
    failing = client.submit(fault, KIND, pure=False)
    if KIND == "sigkill":
        wait_for(HERE / "fault-pid")
        os.kill(int((HERE / "fault-pid").read_text()), signal.SIGKILL)
    error = error_of(failing)  # it fails while the bystanders still run
    (HERE / "fault-done").write_text("")
    results = [b.result() for b in bystanders]
    later = [client.submit(where, pure=False).result() for _ in range(3)]
    report(error=error, results=results, later=later, worker_pid=worker_pid,
           worker_pid_after=list(client.run(os.getpid).values())[0],
           fault_pid=int((HERE / "fault-pid").read_text()), processes=descendants())
"""

EXPECTED_FAULT = {
    "segfault": ("WorkerDied", r"died \(signal SIGSEGV \(11\)\) while running task \d+: .*fault"),
    "exit": ("WorkerDied", r"died \(exit code 3\) while running task \d+: .*fault"),
    "sigkill": ("WorkerDied", r"died \(signal SIGKILL \(9\)\) while running task \d+: .*fault"),
    "timeout": ("TaskTimeout", r"ran longer than its timeout of 4 s and was stopped"),
}


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("kind", list(EXPECTED_FAULT))
def test_a_task_that_kills_its_process_fails_alone_and_the_dask_worker_lives_on(
        kind, method, tmp_path):
    facts = run(f"KIND = {kind!r}\n" + FAULT_SCENARIO, tmp_path, method)
    name, pattern = EXPECTED_FAULT[kind]
    error = facts["error"]
    assert error.get("type") == name and error["module"] == "pool", error
    assert re.search(pattern, error["message"]), error["message"]
    assert f"pid {facts['fault_pid']}" in error["message"]
    if kind == "segfault":  # the crash site travels to the client
        assert "Fatal Python error: Segmentation fault" in error["message"]
        assert "in fault" in error["message"]
    if kind == "timeout":  # the stack it was stuck in
        assert "in fault" in error["message"]
    assert error["is_broken_pool"] == (name == "WorkerDied")
    # The bystanders ran next to it, in other pool processes, and succeeded.
    assert [r[:2] for r in facts["results"]] == [["bystander", 0], ["bystander", 1]]
    pool_pids = {r[2] for r in facts["results"]} | set(facts["later"]) | {facts["fault_pid"]}
    assert facts["worker_pid"] not in pool_pids
    assert facts["worker_pid_after"] == facts["worker_pid"]  # the dask worker survived
    assert len(facts["later"]) == 3 and facts["fault_pid"] not in facts["later"]
    assert set(facts["processes"]) >= pool_pids - {facts["fault_pid"]}


def test_dask_retries_rerun_a_task_whose_process_died(tmp_path):
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        retried = client.submit(dies_on_first_try, str(HERE / "once"), retries=1, pure=False)
        not_retried = client.submit(dies_on_first_try, str(HERE / "never"), pure=False)
        report(retried=error_of(retried), not_retried=error_of(not_retried))
    """, tmp_path)
    assert facts["retried"] == {"result": "'second try'"}
    assert facts["not_retried"]["type"] == "WorkerDied", facts


def test_functions_of_main_run_in_the_pool(tmp_path):
    """dask#6803: module-level functions of the script, functions defined under its
    ``__main__`` guard, lambdas and closures all run in pool processes."""
    facts = run("""
    def guarded(x):
        return x + 1
    offset = 10
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        worker_pid = list(client.run(os.getpid).values())[0]
        results = [client.submit(guarded, 1).result(),
                   client.submit(lambda x: x * offset, 2).result(),
                   client.submit(where, pure=False).result()]
        report(results=results, worker_pid=worker_pid)
    """, tmp_path)
    assert facts["results"][:2] == [2, 20]
    assert facts["results"][2] != facts["worker_pid"]


def test_a_named_executor_runs_only_the_tasks_annotated_with_it(tmp_path):
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin("processes", max_workers=1))
        worker_pid = list(client.run(os.getpid).values())[0]
        in_threads = client.submit(where, pure=False).result()
        with dask.annotate(executor="processes"):
            in_pool = client.submit(where, pure=False).result()
            died = error_of(client.submit(os._exit, 5, pure=False))
        executors = client.run(lambda dask_worker: {
            name: type(e).__name__ for name, e in dask_worker.executors.items()})
        report(worker_pid=worker_pid, in_threads=in_threads, in_pool=in_pool, died=died,
               executors=list(executors.values())[0])
    """, tmp_path)
    assert facts["in_threads"] == facts["worker_pid"]
    assert facts["in_pool"] != facts["worker_pid"]
    assert facts["died"]["type"] == "WorkerDied" and "exit code 5" in facts["died"]["message"]
    assert facts["executors"]["processes"] == "ProcessPool"
    assert facts["executors"]["default"] == "ThreadPoolExecutor"


def test_the_preload_installs_the_pool_with_its_options(tmp_path):
    facts = run("""
    with cluster(preload=["pool.dask"],
                 preload_argv=["--pool-max-workers", "2", "--pool-task-timeout", "3"]
                 ) as c, Client(c) as client:
        worker_pid = list(client.run(os.getpid).values())[0]
        in_pool = client.submit(where, pure=False).result()
        timed_out = error_of(client.submit(time.sleep, 60, pure=False))
        sizes = client.run(lambda dask_worker: dask_worker.executors["default"]._max_workers)
        report(worker_pid=worker_pid, in_pool=in_pool, timed_out=timed_out,
               max_workers=list(sizes.values())[0])
    """, tmp_path)
    assert facts["in_pool"] != facts["worker_pid"]
    assert facts["timed_out"]["type"] == "TaskTimeout", facts
    assert facts["max_workers"] == 2


def test_the_pool_is_sized_to_the_dask_workers_threads(tmp_path):
    facts = run("""
    with cluster(threads_per_worker=2) as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        sizes = client.run(lambda dask_worker: dask_worker.executors["default"]._max_workers)
        report(max_workers=list(sizes.values())[0])
    """, tmp_path)
    assert facts["max_workers"] == 2


def test_the_pool_ends_with_a_dask_worker_its_nanny_restarts(tmp_path):
    """SIGKILL the dask worker (as the nanny's memory limit or the OOM killer would): its
    pool's processes end by themselves, the nanny starts a new worker, and the plugin gives
    it a pool of its own."""
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        old_worker = list(client.run(os.getpid).values())[0]
        old_pool = client.submit(where, pure=False).result()
        os.kill(old_worker, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while psutil.pid_exists(old_pool) and time.monotonic() < deadline:
            time.sleep(0.05)
        old_pool_alive = psutil.pid_exists(old_pool) and psutil.Process(old_pool).status() != "zombie"
        client.wait_for_workers(1, timeout=60)
        while True:  # the restarted worker, once the scheduler has it
            pids = list(client.run(os.getpid).values())
            if pids and pids[0] != old_worker:
                break
            time.sleep(0.05)
        new_pool = client.submit(where, pure=False).result()
        report(old_worker=old_worker, new_worker=pids[0], old_pool=old_pool,
               old_pool_alive=old_pool_alive, new_pool=new_pool)
    """, tmp_path)
    assert not facts["old_pool_alive"]
    assert facts["new_worker"] != facts["old_worker"]
    assert facts["new_pool"] not in (facts["new_worker"], facts["old_pool"])


def test_removing_the_plugin_lets_running_tasks_finish_and_puts_threads_back(tmp_path):
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        worker_pid = list(client.run(os.getpid).values())[0]
        running = client.submit(bystander, 0, pure=False)
        wait_for(HERE / "bystander-0")
        pool_pid = int((HERE / "bystander-0").read_text())
        import threading
        remover = threading.Thread(target=client.unregister_worker_plugin,
                                   args=("pool-executor-default",))
        remover.start()
        while client.run(lambda dask_worker: type(dask_worker.executors["default"]).__name__
                         ).popitem()[1] != "ThreadPoolExecutor":
            time.sleep(0.01)  # (the removal has begun: new tasks go to threads)
        during = client.submit(where, pure=False).result()
        waited = remover.is_alive()  # it waits for the task, which waits for the file
        (HERE / "fault-done").write_text("")
        remover.join(60)
        result = running.result()
        after = client.submit(where, pure=False).result()
        report(worker_pid=worker_pid, pool_pid=pool_pid, result=result, after=after,
               during=during, waited=waited,
               pool_gone=not psutil.pid_exists(pool_pid) or
                         psutil.Process(pool_pid).status() == "zombie")
    """, tmp_path)
    assert facts["result"][:2] == ["bystander", 0]
    assert facts["during"] == facts["after"] == facts["worker_pid"]  # threads again
    assert facts["waited"]
    assert facts["pool_gone"]


def test_the_worker_reports_its_childrens_memory(tmp_path):
    facts = run("""
    def hold(n):
        block = bytearray(n)
        block[::4096] = b"x" * len(range(0, n, 4096))  # touch every page
        (HERE / "holding").write_text("")
        wait_for(HERE / "release")
        return len(block)
    with cluster(memory_limit="8GiB") as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        own = client.run(lambda dask_worker: dask_worker.monitor.proc.memory_info().rss)
        held = client.submit(hold, 300 * 2**20, pure=False)
        wait_for(HERE / "holding")
        time.sleep(0.6)  # (the children's share is read at most every 0.5 s)
        reported = client.run(lambda dask_worker: dask_worker.monitor.get_process_memory())
        (HERE / "release").write_text("")
        held.result()
        report(own=list(own.values())[0], reported=list(reported.values())[0])
    """, tmp_path)
    assert facts["reported"] - facts["own"] > 280 * 2**20, facts


def test_a_dask_worker_command_with_the_preload(tmp_path):
    """What a user types: ``dask scheduler`` and ``dask worker --preload pool.dask``."""
    facts = run("""
    import subprocess
    dask_cmd = [os.path.join(os.path.dirname(sys.executable), "dask")]
    scheduler_file = str(HERE / "scheduler.json")
    scheduler = subprocess.Popen(dask_cmd + ["scheduler", "--scheduler-file", scheduler_file,
                                             "--host", "127.0.0.1", "--port", "0",
                                             "--no-dashboard"])
    # (The preload's options take the --name=value form: dask worker hands them on.)
    worker = subprocess.Popen(dask_cmd + ["worker", "--scheduler-file", scheduler_file,
                                          "--host", "127.0.0.1", "--nthreads", "2",
                                          "--no-dashboard", "--preload", "pool.dask",
                                          "--pool-task-timeout=30", "--pool-max-workers=1"])
    try:
        wait_for(scheduler_file, 60)
        with Client(scheduler_file=scheduler_file, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            worker_pid = list(client.run(os.getpid).values())[0]
            died = error_of(client.submit(os._exit, 7, pure=False))
            after = client.submit(where, pure=False).result()
            sizes = client.run(lambda dask_worker: dask_worker.executors["default"]._max_workers)
            report(worker_pid=worker_pid, after=after, died=died,
                   max_workers=list(sizes.values())[0],
                   worker_pid_after=list(client.run(os.getpid).values())[0])
    finally:
        worker.terminate(); worker.wait(60)
        scheduler.terminate(); scheduler.wait(60)
    """, tmp_path)
    assert facts["died"]["type"] == "WorkerDied" and "exit code 7" in facts["died"]["message"]
    assert facts["after"] != facts["worker_pid"]
    assert facts["worker_pid_after"] == facts["worker_pid"]
    assert facts["max_workers"] == 1


def test_importing_pool_does_not_import_dask():
    code = "import sys, pool; print(sorted(m for m in ('dask', 'distributed', 'pool.dask', 'click') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=str(REPO_DIR.parent), check=True).stdout
    assert out.strip() == "[]"


def test_the_readme_example_runs_as_written(tmp_path):
    blocks = [block for block in re.findall(r"^\.\. code-block:: python\n\n((?:    .*\n|\n)+)",
                                            (REPO_DIR / "README.rst").read_text(), re.M)
              if "pool.dask" in block]
    assert len(blocks) == 1
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(blocks[0]))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-8000:]
    lines = out.splitlines()
    assert lines[:2] == ["0", "1"] and lines[3:] == ["9", "16", "25"], out
    assert re.fullmatch(r"SIGSEGV in \d+", lines[2]), out
    assert wait_until(lambda: not session_members(proc.pid), 15)


def test_closing_the_cluster_mid_task_ends_the_task_and_every_process(tmp_path):
    """A dask worker that closes while its pool runs a task: dask has given the task up,
    so its process is terminated, and the close does not wait for the task's 60 s."""
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        running = client.submit(bystander, 0, "never", pure=False)
        wait_for(HERE / "bystander-0")
        pool_pid = int((HERE / "bystander-0").read_text())
        started = time.monotonic()
        client.close()
        c.close()
        report(pool_pid=pool_pid, close_seconds=time.monotonic() - started,
               pool_gone=not psutil.pid_exists(pool_pid) or
                         psutil.Process(pool_pid).status() == "zombie")
    """, tmp_path, timeout=60)
    assert facts["pool_gone"], facts
    assert facts["close_seconds"] < 30, facts  # (a hang check: the task would run 60 s)


def test_the_plugin_checks_its_options_where_it_is_made():
    from pool.dask import ProcessPoolPlugin
    with pytest.raises(ValueError, match="start_method must be one of"):
        ProcessPoolPlugin(start_method="thread")
    with pytest.raises(ValueError, match="dask keeps for itself"):
        ProcessPoolPlugin("offload")
    with pytest.raises(TypeError, match="executor must be"):
        ProcessPoolPlugin("")
    with pytest.raises(ValueError, match="task_timeout must be > 0"):
        ProcessPoolPlugin(task_timeout=-1)
    with pytest.raises(TypeError, match="initializer must be a callable"):
        ProcessPoolPlugin(initializer=3)
    plugin = ProcessPoolPlugin("processes", task_timeout=5)
    assert plugin.name == "pool-executor-processes"
    assert repr(plugin) == "ProcessPoolPlugin('processes', task_timeout=5, start_method=None)"


def test_the_forkserver_preloads_distributed_so_a_replaced_process_starts_fast(tmp_path):
    """Each pool process would otherwise import distributed itself (~0.4 s) before its
    first task, after every death; the user's own preload list is kept."""
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin(start_method="forkserver"))
        client.submit(where, pure=False).result()
        preloaded = client.run(lambda: __import__("multiprocessing").forkserver
                               ._forkserver._preload_modules)
        report(preloaded=list(preloaded.values())[0])
    """, tmp_path)
    assert facts["preloaded"] == ["__main__", "distributed.worker", "pool._worker"]


def test_without_the_plugin_a_pool_in_a_nanny_worker_says_what_to_do(tmp_path):
    """The restriction the plugin lifts: a nanny's worker is daemonic, and a ProcessPool
    made there by hand fails at once, naming the plugin; with the plugin the flag is off
    in the dask worker process (not in the pool's own processes)."""
    facts = run("""
    def make_pool():
        try:
            pool.ProcessPool(1)
            return "made"
        except RuntimeError as exc:
            return str(exc)
    def daemonic():
        import multiprocessing
        return multiprocessing.current_process().daemon
    with cluster() as c, Client(c) as client:
        refused = list(client.run(make_pool).values())[0]
        before = list(client.run(daemonic).values())[0]
        client.register_plugin(ProcessPoolPlugin())
        after = list(client.run(daemonic).values())[0]
        report(refused=refused, before=before, after=after)
    """, tmp_path)
    assert "daemonic" in facts["refused"] and "pool.dask.ProcessPoolPlugin" in facts["refused"]
    assert facts["before"] is True and facts["after"] is False

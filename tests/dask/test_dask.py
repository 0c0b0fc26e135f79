"""pool.dask on a real ``distributed.LocalCluster`` (nanny and worker processes).

Each scenario runs in a child interpreter of its own, in a session of its own, under a hard
timeout; after it ends the test checks that no process of that session is left (nanny,
dask worker, pool workers, forkserver). Tasks and script meet through files, not sleeps.
Run by tox's ``dask`` environment (``pip install 'sturdypool[dask]'``), not the core matrix.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from doc_examples import run_guide_example
from helpers import REPO_DIR, START_METHODS, run_scenario_in_session

pytest.importorskip("distributed", reason="pool.dask's tests need pip install 'sturdypool[dask]'")

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
    return run_scenario_in_session(script, env, timeout)


FAULT_SCENARIO = """
options = {"task_timeout": 10} if KIND == "timeout" else {}
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
    "timeout": ("TaskTimeout", r"ran longer than its timeout of 10 s and was stopped"),
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
    assert facts["executors"]["processes"] == "_DaskWorkerPool"  # (a ProcessPool)
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
    with cluster(threads_per_worker=3) as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        sizes = client.run(lambda dask_worker: dask_worker.executors["default"]._max_workers)
        report(max_workers=list(sizes.values())[0], cpus=os.cpu_count())
    """, tmp_path)
    assert facts["max_workers"] == 3 != facts["cpus"]  # (not the pool's own default)


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
            try:
                pids = list(client.run(os.getpid).values())
            except Exception:  # (the scheduler may still list the dead one)
                pids = []
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


def test_removing_the_plugin_puts_threads_back_at_once_and_lets_running_tasks_finish(
        tmp_path):
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        worker_pid = list(client.run(os.getpid).values())[0]
        running = client.submit(bystander, 0, pure=False)
        wait_for(HERE / "bystander-0")
        pool_pid = int((HERE / "bystander-0").read_text())
        client.unregister_worker_plugin("pool-executor-default")  # returns at once
        during = client.submit(where, pure=False).result()  # in threads again
        still_running = not running.done() and psutil.pid_exists(pool_pid)
        (HERE / "fault-done").write_text("")
        result = running.result()
        deadline = time.monotonic() + 30
        while not gone(pool_pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        report(worker_pid=worker_pid, result=result, during=during,
               still_running=still_running, pool_gone=gone(pool_pid))
    """, tmp_path)
    assert facts["during"] == facts["worker_pid"]
    assert facts["still_running"]  # the removal did not wait for it, nor end it
    assert facts["result"][:2] == ["bystander", 0]
    assert facts["pool_gone"]  # once its task was done, the removed pool ended


def test_registering_again_replaces_the_pool_without_waiting_for_its_tasks(tmp_path):
    facts = run("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin(max_workers=1))
        running = client.submit(bystander, 0, pure=False)
        wait_for(HERE / "bystander-0")
        client.register_plugin(ProcessPoolPlugin(max_workers=2, task_timeout=30))
        options = client.run(lambda dask_worker: (dask_worker.executors["default"]._max_workers,
                                                  dask_worker.executors["default"]._task_timeout))
        new_pool = client.submit(where, pure=False).result()
        old_done = running.done()
        (HERE / "fault-done").write_text("")
        report(options=list(options.values())[0], new_pool=new_pool, old_done=old_done,
               old_pool=int((HERE / "bystander-0").read_text()), result=running.result())
    """, tmp_path)
    assert facts["options"] == [2, 30.0]
    assert facts["new_pool"] != facts["old_pool"] and not facts["old_done"]
    assert facts["result"][:2] == ["bystander", 0]


def test_sys_exit_in_a_task_fails_the_task_not_the_dask_worker(tmp_path):
    """distributed lets SystemExit end the process it is raised in, so with threads a
    task's sys.exit() ends the dask worker; in a pool process it fails the task."""
    facts = run("""
    def interrupted():
        raise KeyboardInterrupt
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        worker_pid = list(client.run(os.getpid).values())[0]
        exited = error_of(client.submit(sys.exit, 4, pure=False))
        interrupt = error_of(client.submit(interrupted, pure=False))
        report(worker_pid=worker_pid, exited=exited, interrupt=interrupt,
               worker_pid_after=list(client.run(os.getpid).values())[0],
               later=client.submit(where, pure=False).result())
    """, tmp_path)
    assert facts["exited"]["type"] == "RuntimeError", facts
    assert "SystemExit(4,)" in facts["exited"]["message"]
    assert facts["interrupt"]["type"] == "RuntimeError"
    assert "KeyboardInterrupt" in facts["interrupt"]["message"]
    assert facts["worker_pid_after"] == facts["worker_pid"] != facts["later"]


def test_the_worker_reports_its_childrens_memory(tmp_path):
    """A task holding 300 MiB shows in the dask worker's memory reading (which its spill
    and pause thresholds act on); idle pool processes count their proportional share
    (PSS), not the pages they share with the forkserver once each (RSS)."""
    facts = run("""
    def hold(n):
        block = bytearray(n)
        block[::4096] = b"x" * len(range(0, n, 4096))  # touch every page
        (HERE / "holding").write_text("")
        wait_for(HERE / "release")
        return len(block)
    def reading(dask_worker):
        own = dask_worker.monitor.proc.memory_info().rss
        children = dask_worker.monitor.proc.children(recursive=True)
        return (dask_worker.monitor.get_process_memory() - own,
                sum(child.memory_info().rss for child in children))
    def measure():
        return list(client.run(reading).values())[0]
    with cluster(memory_limit="8GiB") as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        client.gather([client.submit(together, i, 3, pure=False) for i in range(3)])
        time.sleep(0.6)  # (the children's share is read at most every 0.5 s)
        idle_counted, idle_rss = measure()
        held = client.submit(hold, 300 * 2**20, pure=False)
        wait_for(HERE / "holding")
        deadline = time.monotonic() + 30
        while measure()[0] - idle_counted < 280 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
        holding_counted = measure()[0]
        (HERE / "release").write_text("")
        held.result()
        report(idle_counted=idle_counted, idle_rss=idle_rss, holding_counted=holding_counted)
    """, tmp_path)
    assert facts["holding_counted"] - facts["idle_counted"] > 280 * 2**20, facts
    assert 0 < facts["idle_counted"] < 0.8 * facts["idle_rss"], facts


def test_dask_worker_commands_with_the_preload(tmp_path):
    """What a user types: ``dask scheduler``, then ``dask worker --preload pool.dask`` with
    options on its command line, and one with them in dask's configuration (the way that
    works with ``--scheduler-file``, where dask worker takes the first unknown option for
    the scheduler's address)."""
    facts = run("""
    import subprocess
    dask_cmd = [os.path.join(os.path.dirname(sys.executable), "dask")]
    scheduler_file = str(HERE / "scheduler.json")
    processes = [subprocess.Popen(dask_cmd + ["scheduler", "--scheduler-file", scheduler_file,
                                              "--host", "127.0.0.1", "--port", "0",
                                              "--no-dashboard"])]
    try:
        wait_for(scheduler_file, 60)
        address = json.loads(Path(scheduler_file).read_text())["address"]
        worker = ["worker", "--host", "127.0.0.1", "--nthreads", "2", "--no-dashboard",
                  "--preload", "pool.dask"]
        # (The preload's options take the --name=value form: dask worker hands them on.)
        processes.append(subprocess.Popen(dask_cmd + worker[:1] + [address] + worker[1:] + [
            "--name", "argv", "--pool-task-timeout=30", "--pool-max-workers=1"]))
        processes.append(subprocess.Popen(
            dask_cmd + worker + ["--name", "config", "--scheduler-file", scheduler_file],
            env=dict(os.environ, DASK_POOL__TASK_TIMEOUT="20", DASK_POOL__MAX_WORKERS="3")))
        with Client(scheduler_file=scheduler_file, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            def facts(dask_worker):
                pool = dask_worker.executors["default"]
                return dask_worker.name, os.getpid(), pool._max_workers, pool._task_timeout
            before = sorted(client.run(facts).values())
            died = {}
            for name, *_ in before:
                died[name] = error_of(client.submit(os._exit, 7, workers=[name],
                                                    pure=False))
            later = {name: client.submit(where, workers=[name], pure=False).result()
                     for name, *_ in before}
            report(before=before, after=sorted(client.run(facts).values()), died=died,
                   later=later)
    finally:
        for process in processes[::-1]:
            process.terminate()
            process.wait(60)
    """, tmp_path)
    (argv_name, argv_pid, argv_size, argv_timeout), (config_name, config_pid, config_size,
                                                     config_timeout) = facts["before"]
    assert (argv_name, argv_size, argv_timeout) == ("argv", 1, 30.0)
    assert (config_name, config_size, config_timeout) == ("config", 3, 20.0)
    assert facts["after"] == facts["before"]  # the same dask worker processes
    for name, pid in (("argv", argv_pid), ("config", config_pid)):
        assert facts["died"][name]["type"] == "WorkerDied", facts
        assert "exit code 7" in facts["died"][name]["message"]
        assert facts["later"][name] != pid


def test_importing_pool_does_not_import_dask():
    code = "import sys, pool; print(sorted(m for m in ('dask', 'distributed', 'pool.dask', 'click') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=str(REPO_DIR.parent), check=True).stdout
    assert out.strip() == "[]"


def test_the_guide_example_runs_as_written(tmp_path):
    # docs/guide/dask.rst's example (tests/test_readme.py runs the others).
    out = run_guide_example("dask.rst", "pool.dask", tmp_path)
    lines = out.splitlines()
    assert lines[:2] == ["0", "1"] and lines[3:] == ["9", "16", "25"], out
    assert re.fullmatch(r"SIGSEGV in \d+", lines[2]), out


@pytest.mark.parametrize("removed", [False, True], ids=["installed", "removed first"])
def test_closing_the_cluster_mid_task_ends_the_task_and_every_process(tmp_path, removed):
    """A dask worker that closes while its pool runs a task: dask has given the task up,
    so its process is terminated, and the close does not wait for the task's 60 s. The
    same for the pool of a plugin removed just before (it was finishing its task)."""
    facts = run(f"REMOVED = {removed}\n" + textwrap.dedent("""
    with cluster() as c, Client(c) as client:
        client.register_plugin(ProcessPoolPlugin())
        running = client.submit(bystander, 0, "never", pure=False)
        wait_for(HERE / "bystander-0")
        pool_pid = int((HERE / "bystander-0").read_text())
        if REMOVED:
            client.unregister_worker_plugin("pool-executor-default")
        started = time.monotonic()
        client.close()
        c.close()
        report(pool_pid=pool_pid, close_seconds=time.monotonic() - started,
               pool_gone=gone(pool_pid))
    """), tmp_path, timeout=60)
    assert facts["pool_gone"], facts
    assert facts["close_seconds"] < 30, facts  # (a hang check: the task would run 60 s)
    # The worker closed by itself, not by its nanny's kill after a timeout.
    assert "still alive after" not in facts["stderr"], facts["stderr"][-4000:]


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
    assert facts["preloaded"] == ["__main__", "distributed.worker", "pool._worker.main",
                                  "pool._errors", "cloudpickle", "tblib.pickling_support"]


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


@pytest.mark.timeout(600)   # six runs, each up to its exit bound and orphan bound
def test_a_short_shake_of_pool_dask():
    """pool.dask joins the shake (tests/shake.py): a dask worker whose executor is pool gets
    SIGINT, SIGTERM or SIGKILL at a random moment of a gather, on a starved CPU; it exits
    in time and leaves no process."""
    import random
    import shake
    with shake.Busy(2 * (os.cpu_count() or 1)):
        outcomes = [shake.run_once("dask", method, seed=random.randrange(10**9))
                    for method in START_METHODS * 2]
    failed = [o for o in outcomes if o.problems]
    assert not failed, "\n".join(f"{o.path}:{o.method}:{o.seed} {o.signal}: {o.problems}\n"
                                 f"{o.detail}" for o in failed)

"""pool.joblib: joblib's ``Parallel`` on pool (the backend ``"pool"``).

Each scenario runs in a child interpreter of its own, in a session of its own, under a hard
timeout; after it ends the test checks that no process of that session is left. Calls and
scenario meet through files, not sleeps. Run by tox's ``joblib`` environment (``pip install
'sturdypool[joblib]'`` and scikit-learn), not the core matrix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from doc_examples import run_guide_example
from helpers import (START_METHODS, TESTS_DIR, run_scenario_in_session,
                     session_members, wait_until)

pytest.importorskip("joblib", reason="pool.joblib's tests need pip install 'sturdypool[joblib]'")

HERE = Path(__file__).resolve().parent
PRELUDE = (HERE / "joblib_scenario.py").read_text()

pytestmark = pytest.mark.timeout(180)


def scenario(body: str, tmp_path: Path) -> Path:
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + "\n\nif __name__ == '__main__':\n"
                      + textwrap.indent(textwrap.dedent(body), "    "))
    return script


def environment(method: str) -> dict[str, str]:
    return dict(os.environ, POOL_TEST_START_METHOD=method, PYTHONFAULTHANDLER="1",
                POOL_TESTS_DIR=str(TESTS_DIR))


def run_env(method: str, tmp_path: Path) -> dict[str, str]:
    return dict(environment(method), SCENARIO_DIR=str(tmp_path))


def run(body: str, tmp_path: Path, method: str = "forkserver", *, timeout: float = 100
        ) -> tuple[dict[str, Any], str]:
    """Runs a scenario; returns what it passed to ``report()`` and its stderr, once every
    process of its session is confirmed gone."""
    facts = run_scenario_in_session(scenario(body, tmp_path), run_env(method, tmp_path),
                                    timeout)
    return facts, facts.pop("stderr")


# -- the backend and joblib's conventions ------------------------------------------------

def test_importing_pool_does_not_import_joblib_and_pool_joblib_registers_the_backend():
    code = ("import sys, pool; print('joblib' in sys.modules); import pool.joblib, joblib; "
            "print(joblib.parallel.BACKENDS['pool'].__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.split() == ["False", "PoolBackend"], proc.stderr


def test_parallel_runs_on_pool_with_each_return_as_and_batch_size(tmp_path):
    facts, _ = run('''
        me = os.getpid()
        with parallel_config(backend="pool", n_jobs=2, start_method=METHOD):
            as_list = Parallel()(delayed(square)(i) for i in range(50))
            as_generator = Parallel(return_as="generator")(delayed(square)(i) for i in range(50))
            assert not isinstance(as_generator, list)
            ordered = list(as_generator)
            unordered = list(Parallel(return_as="generator_unordered")(
                delayed(square)(i) for i in range(50)))
            batched = Parallel(batch_size=7)(delayed(square)(i) for i in range(50))
            pids = set(Parallel()(delayed(pid_of)(i) for i in range(20)))
        report(as_list=as_list, ordered=ordered, unordered=sorted(unordered),
               batched=batched, in_parent=me in pids)
    ''', tmp_path)
    squares = [i * i for i in range(50)]
    assert facts == dict(as_list=squares, ordered=squares, unordered=squares,
                         batched=squares, in_parent=False)


def test_n_jobs_follows_joblibs_rules(tmp_path):
    facts, _ = run('''
        from joblib import cpu_count
        me = os.getpid()
        with parallel_config(backend="pool"):
            try:
                Parallel(n_jobs=0)(delayed(square)(1) for _ in range(2))
            except ValueError as error:
                zero = str(error)
            one = set(Parallel(n_jobs=1)(delayed(pid_of)() for _ in range(4)))
            default = set(Parallel()(delayed(pid_of)() for _ in range(4)))
            backend = pool.joblib.PoolBackend(nesting_level=0)
        report(zero=zero, one_is_here=one == {me}, default_is_here=default == {me},
               minus_one=backend.effective_n_jobs(-1) == cpu_count(),
               minus_two=backend.effective_n_jobs(-2) == max(cpu_count() - 1, 1),
               minus_many=backend.effective_n_jobs(-1000))
    ''', tmp_path)
    assert facts == dict(zero="n_jobs == 0 in Parallel has no meaning", one_is_here=True,
                         default_is_here=True, minus_one=True, minus_two=True,
                         minus_many=1)


def test_an_unknown_option_is_refused_where_it_is_given(tmp_path):
    facts, _ = run('''
        try:
            parallel_config(backend="pool", task_timout=5)
        except TypeError as error:
            told = str(error)
        report(told=told)
    ''', tmp_path)
    assert facts["told"].startswith("joblib's 'pool' backend has no option 'task_timout'")


def test_the_start_method_is_the_options(tmp_path):
    facts, _ = run('''
        me = os.getpid()
        parents = {}
        for method in ("spawn", "forkserver", "fork"):
            with parallel_config(backend="pool", n_jobs=2, start_method=method):
                parents[method] = set(Parallel()(delayed(parent_of)() for _ in range(4)))
        report(spawn=parents["spawn"] == {me}, fork=parents["fork"] == {me},
               forkserver=me not in parents["forkserver"])
    ''', tmp_path)
    assert facts == dict(spawn=True, fork=True, forkserver=True)


def test_workers_are_reused_across_calls_and_a_new_configuration_ends_unused_pools(
        tmp_path):
    facts, _ = run('''
        first = set(Parallel(n_jobs=2, backend="pool")(delayed(pid_of)() for _ in range(20)))
        again = set(Parallel(n_jobs=2, backend="pool")(delayed(pid_of)() for _ in range(20)))
        other = set(Parallel(n_jobs=2, backend="pool", max_tasks_per_child=100)(
            delayed(pid_of)() for _ in range(20)))
        used = first | again  # (one pool's two workers: either may have run them all)
        gone = helpers.wait_until(lambda: not any(helpers.process_exists(p) for p in used))
        report(reused=len(used) <= 2, other=not (other & used), gone=gone)
    ''', tmp_path)
    assert facts == dict(reused=True, other=True, gone=True)


def test_idle_workers_end_after_idle_worker_timeout(tmp_path):
    facts, _ = run('''
        with parallel_config(backend="pool", n_jobs=2, idle_worker_timeout=0.5):
            pids = set(Parallel()(delayed(pid_of)() for _ in range(10)))
        gone = helpers.wait_until(lambda: not any(helpers.process_exists(p) for p in pids), 20)
        report(gone=gone)
    ''', tmp_path)
    assert facts == dict(gone=True)


def test_nested_calls_run_on_threads_of_their_worker_with_its_share_of_the_cores(
        tmp_path):
    facts, _ = run('''
        from joblib import cpu_count
        with parallel_config(backend="pool", n_jobs=2, start_method=METHOD):
            found = Parallel()(delayed(nested)(4) for _ in range(2))
            threads = Parallel()(delayed(thread_settings)() for _ in range(2))
        with parallel_config(backend="pool", n_jobs=2, inner_max_num_threads=1):
            one = Parallel()(delayed(thread_settings)() for _ in range(2))
            twice = Parallel()(delayed(nested_twice)() for _ in range(2))
        share = str(max(cpu_count() // 2, 1))
        report(backends=sorted({name for name, _, _ in found}),
               in_worker=all(pids == [worker] for _, pids, worker in found),
               env=sorted({env for env, _ in threads}) == [share],
               native=sorted({tuple(counts) for _, counts in threads}) == [(int(share),)],
               one=sorted({env for env, _ in one}) == ["1"],
               native_one=sorted({tuple(counts) for _, counts in one}) == [(1,)],
               twice=sorted({name for names in twice for name in names}))
    ''', tmp_path)
    assert facts == dict(backends=["ThreadingBackend"], in_worker=True, env=True,
                         native=True, one=True, native_one=True, twice=["SequentialBackend"])


def test_thread_limits_reach_a_forked_worker_that_has_numpy_loaded(tmp_path):
    facts, _ = run('''
        import numpy  # loaded (with its BLAS) before the workers are forked
        from threadpoolctl import threadpool_info
        before = sorted({info["num_threads"] for info in threadpool_info()})
        with parallel_config(backend="pool", n_jobs=2, start_method="fork",
                             inner_max_num_threads=1):
            threads = Parallel()(delayed(thread_settings)() for _ in range(2))
        report(threads=sorted({tuple(counts) for _, counts in threads}), before=before)
    ''', tmp_path)
    assert facts["threads"] == [[1]] or facts["before"] == [], facts


# -- deaths, timeouts and the first error ------------------------------------------------

@pytest.mark.parametrize("method", START_METHODS)
def test_a_death_is_one_named_workerdied_and_the_next_call_runs_at_once(method, tmp_path):
    facts, err = run('''
        with parallel_config(backend="pool", n_jobs=2, start_method=METHOD):
            try:
                Parallel()(delayed(segfault_at)(i, 5) for i in range(10))
            except pool.WorkerDied as error:
                died = error
            after = Parallel()(delayed(square)(i) for i in range(10))
            (shared,) = pool.joblib._pools._shared  # the one pool, which went on
            stats = shared.pool.stats()
        report(text=str(died), signal=died.signal_name, call=died.task.call(),
               gone=not helpers.process_exists(died.pid), after=after,
               deaths=stats.worker_deaths, workers=shared.pool._max_workers)
    ''', tmp_path, method)
    assert facts["signal"] == "SIGSEGV"
    assert facts["call"] == "__main__.segfault_at(5, 5)"
    assert facts["gone"] and facts["deaths"] == 1 and facts["workers"] == 2, facts
    assert facts["after"] == [i * i for i in range(10)]
    assert "in segfault_at" in facts["text"], facts["text"]  # the crash site's stack


def test_a_death_in_a_batch_names_the_call_that_was_running(tmp_path):
    facts, _ = run('''
        with parallel_config(backend="pool", n_jobs=2):
            try:
                Parallel(batch_size=4)(delayed(segfault_at)(i, 6) for i in range(12))
            except pool.WorkerDied as error:
                died = error
        report(call=died.task.call(), notes=died.__notes__)
    ''', tmp_path)
    assert facts == dict(call="__main__.segfault_at(6, 6)",
                         notes=["(call 3 of a batch of 4: the calls before it had finished)"])


def test_generator_unordered_yields_the_calls_that_finished_before_a_death(tmp_path):
    """The dying call waits until the four before it were taken: they are delivered, and
    the death then ends the generator. (joblib raises a call's error as soon as it is
    known, and drops results not yet taken then, whatever the backend.)"""
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        calls = [delayed(square)(i) for i in range(4)]
        calls.append(delayed(segfault_when)(os.path.join(d, "taken")))
        got = []
        with parallel_config(backend="pool", n_jobs=2):
            try:
                for value in Parallel(return_as="generator_unordered", batch_size=1)(calls):
                    got.append(value)
                    if len(got) == 4:
                        open(os.path.join(d, "taken"), "w").close()
            except pool.WorkerDied as error:
                died = error.task.call()
        report(got=sorted(got), died=died)
    ''', tmp_path)
    assert facts["got"] == [0, 1, 4, 9]
    assert facts["died"].startswith("__main__.segfault_when(")


def test_task_timeout_stops_the_call_and_names_it(tmp_path):
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        with parallel_config(backend="pool", n_jobs=2, task_timeout=1):
            try:
                Parallel()(delayed(mark_then_sleep)(d, f"call{i}", 0.1 if i else 600)
                           for i in range(4))
            except pool.TaskTimeout as error:
                timed_out = error.task.call()
            after = Parallel()(delayed(square)(i) for i in range(4))
        stuck = pid_in(d, "call0")
        report(timed_out=timed_out, stuck_gone=helpers.wait_until(
            lambda: not helpers.process_exists(stuck)), after=after)
    ''', tmp_path)
    assert facts["timed_out"].startswith("__main__.mark_then_sleep(")
    assert "'call0', 600)" in facts["timed_out"]
    assert facts["stuck_gone"] and facts["after"] == [0, 1, 4, 9]


@pytest.mark.parametrize("method", START_METHODS)
def test_the_first_error_stops_running_calls_and_cancels_queued_ones(method, tmp_path):
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        def calls():
            yield delayed(mark_then_sleep)(d, "long", 600)
            yield delayed(fail_when)(os.path.join(d, "long"))  # the first is running
            for i in range(20):
                yield delayed(mark)(d, f"queued{i}")
        started = time.monotonic()
        with parallel_config(backend="pool", n_jobs=2, start_method=METHOD):
            try:
                Parallel(batch_size=1)(calls())
            except ValueError as error:
                failed = str(error)
                notes = error.__notes__
            long = pid_in(d, "long")
            gone = helpers.wait_until(lambda: not helpers.process_exists(long))
            after = Parallel()(delayed(square)(i) for i in range(4))
        report(failed=failed, notes=notes, gone=gone, after=after,
               seconds=time.monotonic() - started,
               queued_ran=len([n for n in os.listdir(d) if n.startswith("queued")]))
    ''', tmp_path, method)
    assert facts["failed"] == "the other call is running"
    assert "in fail_when" in facts["notes"][0] and "raise ValueError" in facts["notes"][0]
    # (by value, as all of a batch, yet with its file's name: not cloudpickle's own)
    assert "scenario.py" in facts["notes"][0], facts["notes"]
    assert facts["gone"] and facts["after"] == [0, 1, 4, 9]
    assert facts["queued_ran"] < 20 and facts["seconds"] < 60, facts


def test_parallel_timeout_raises_and_stops_the_running_call(tmp_path):
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        with parallel_config(backend="pool", n_jobs=2):
            Parallel()(delayed(square)(i) for i in range(4))  # the workers are up
            try:
                Parallel(timeout=1)(delayed(mark_then_sleep)(d, f"c{i}", 600) for i in range(2))
            except multiprocessing.TimeoutError:  # (joblib's, as with loky)
                raised = True
            pids = [pid_in(d, f"c{i}") for i in range(2)]
            gone = helpers.wait_until(lambda: not any(map(helpers.process_exists, pids)))
        report(raised=raised, gone=gone)
    ''', tmp_path)
    assert facts == dict(raised=True, gone=True)


def test_max_tasks_and_max_memory_per_child_replace_workers(tmp_path):
    facts, _ = run('''
        with parallel_config(backend="pool", n_jobs=2, max_tasks_per_child=1):
            one_each = Parallel(batch_size=1)(delayed(pid_of)() for _ in range(6))
        with parallel_config(backend="pool", n_jobs=2, max_memory_per_child=200 << 20):
            capped = Parallel(batch_size=1)(delayed(hold_memory)(300) for i in range(4))
        report(one_each=len(set(one_each)), capped=len(set(capped)))
    ''', tmp_path)
    assert facts == dict(one_each=6, capped=4)


def test_a_ctrl_c_during_parallel_ends_every_process(tmp_path):
    script = scenario('''
        d = os.environ["SCENARIO_DIR"]
        with parallel_config(backend="pool", n_jobs=2):
            try:
                Parallel()(delayed(mark_then_sleep)(d, f"c{i}", 600) for i in range(4))
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                raise
    ''', tmp_path)
    env = run_env("forkserver", tmp_path)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path),
                            start_new_session=True)
    try:
        assert wait_until(lambda: (tmp_path / "c0").exists() and (tmp_path / "c1").exists(),
                          60)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert out == "interrupted\n", err
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert wait_until(lambda: not session_members(proc.pid), 15), session_members(proc.pid)


# -- what travels ------------------------------------------------------------------------

def test_functions_and_classes_of_a_main_that_workers_cannot_import_go_by_value(tmp_path):
    code = textwrap.dedent('''
        import pool.joblib
        from joblib import Parallel, delayed, parallel_config
        def cube(x):
            return x ** 3
        class Scale:  # (a custom estimator in a notebook, say)
            def __init__(self, by):
                self.by = by
            def apply(self, x):
                return x * self.by
        def apply(scale, x):
            return scale.apply(x)
        with parallel_config(backend="pool", n_jobs=2):
            print(Parallel()(delayed(cube)(i) for i in range(5)),
                  Parallel()(delayed(lambda x: -x)(i) for i in range(3)),
                  Parallel()(delayed(apply)(Scale(10), i) for i in range(3)),
                  Parallel()(delayed(Scale(3).apply)(i) for i in range(3)))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))
    assert proc.stdout == "[0, 1, 8, 27, 64] [0, -1, -2] [0, 10, 20] [0, 3, 6]\n", proc.stderr


def test_large_arrays_travel_both_ways(tmp_path):
    facts, _ = run('''
        import numpy as np
        def double(a):
            return a * 2
        arrays = [np.full((1024, 1024), i, dtype=np.float64) for i in range(4)]  # 8 MiB
        with parallel_config(backend="pool", n_jobs=2):
            out = Parallel()(delayed(double)(a) for a in arrays)
        def lies_in(array):  # what holds the result's memory, at the end of its bases
            held = array
            while isinstance(held, (np.ndarray, memoryview)):
                held = held.base if isinstance(held, np.ndarray) else held.obj
            return type(held).__name__
        report(ok=all(isinstance(o, np.ndarray) and (o == 2 * i).all()
                      for i, o in enumerate(out)),
               shared=sorted({lies_in(o) for o in out}))
    ''', tmp_path)
    # On Linux a result views the segment it came in (an mmap); elsewhere, a buffer.
    shared = ["mmap"] if os.environ.get("POOL_PORTABLE") != "1" else ["bytearray"]
    assert facts == dict(ok=True, shared=shared)


def test_an_argument_that_does_not_pickle_fails_the_call_and_the_pool_goes_on(tmp_path):
    facts, _ = run('''
        with parallel_config(backend="pool", n_jobs=2):
            try:
                Parallel()(delayed(square)(threading.Lock()) for _ in range(2))
            except Exception as error:
                failed = f"{type(error).__name__}: {error}"
            after = Parallel()(delayed(square)(i) for i in range(4))
        report(failed=failed, after=after)
    ''', tmp_path)
    assert "cannot pickle" in facts["failed"] and facts["after"] == [0, 1, 4, 9], facts


def test_a_memmap_argument_is_the_same_file_in_the_worker(tmp_path):
    """joblib's pattern for results in shared memory: calls write into a numpy.memmap the
    caller made; the caller sees what they wrote. Views of it, at an offset, go as the file
    too; a strided view, as a copy."""
    facts, _ = run('''
        import numpy as np
        d = os.environ["SCENARIO_DIR"]
        def fill(out, i):
            out[i] = i * 10
            return type(out).__name__, out.mode
        def total(a):
            return float(a.sum())
        out = np.memmap(os.path.join(d, "out"), dtype=np.float64, mode="w+", shape=(8, 3))
        at = np.memmap(os.path.join(d, "at"), dtype=np.uint8, mode="w+", shape=(9000,),
                       offset=10000)
        at[:] = np.arange(9000) % 7
        with parallel_config(backend="pool", n_jobs=2):
            kinds = Parallel()(delayed(fill)(out, i) for i in range(8))
            read = np.memmap(os.path.join(d, "out"), dtype=np.float64, mode="r", shape=(8, 3))
            rows = Parallel()(delayed(total)(read[i]) for i in range(8))
            column = Parallel()(delayed(total)(read[:, 2]) for _ in range(1))
            window = Parallel()(delayed(total)(at[5000:6000]) for _ in range(1))
        report(kinds=sorted(set(map(tuple, kinds))), written=out[:, 0].tolist(), rows=rows,
               column=column, window=window == [float(at[5000:6000].sum())])
    ''', tmp_path)
    assert facts == dict(kinds=[["memmap", "r+"]], written=[i * 10.0 for i in range(8)],
                         rows=[i * 30.0 for i in range(8)], column=[280.0], window=True)


# -- what the review found ---------------------------------------------------------------

def test_a_generator_given_up_stops_its_running_calls(tmp_path):
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        with parallel_config(backend="pool", n_jobs=2):
            calls = [delayed(square)(0)] + [delayed(mark_then_sleep)(d, f"c{i}", 600)
                                            for i in range(2)]
            for value in Parallel(return_as="generator", batch_size=1)(calls):
                assert wait_for_file(os.path.join(d, "c0")) and wait_for_file(
                    os.path.join(d, "c1"))
                break  # (the generator is dropped: joblib aborts it)
            pids = [pid_in(d, f"c{i}") for i in range(2)]
            gone = helpers.wait_until(lambda: not any(map(helpers.process_exists, pids)))
            after = Parallel()(delayed(square)(i) for i in range(4))
        report(gone=gone, after=after)
    ''', tmp_path)
    assert facts == dict(gone=True, after=[0, 1, 4, 9])


def test_a_pool_whose_initializer_failed_is_not_given_to_the_next_call(tmp_path):
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        ready = os.path.join(d, "ready")
        settings = dict(backend="pool", n_jobs=2, initializer=init_failing_unless,
                        initargs=(ready,))
        try:
            Parallel(**settings)(delayed(square)(i) for i in range(4))
        except Exception as error:
            first = type(error).__name__
        open(ready, "w").close()
        second = Parallel(**settings)(delayed(square)(i) for i in range(4))
        report(first=first, second=second, pools=len(pool.joblib._pools))
    ''', tmp_path)
    assert facts == dict(first="InitializerError", second=[0, 1, 4, 9], pools=1)


def test_initializer_runs_in_each_worker_and_equal_settings_share_the_pool(tmp_path):
    facts, _ = run('''
        d = os.environ["SCENARIO_DIR"]
        import numpy as np
        for _ in range(3):  # a fresh, equal tuple each time
            pids = set(Parallel(n_jobs=2, backend="pool", initializer=init_counting,
                                initargs=(d,))(delayed(pid_of)() for _ in range(10)))
        # An array among initargs: the same pool only for the same array.
        key = np.arange(3)
        for _ in range(2):
            Parallel(n_jobs=2, backend="pool", initargs=[key])(delayed(square)(i)
                                                               for i in range(4))
        started = sorted(n for n in os.listdir(d) if n.startswith("started"))
        report(started=len(started), ran_there=all(f"started{p}" in started for p in pids),
               pools=len(pool.joblib._pools))
    ''', tmp_path)
    # One pool's workers (a second starts only if the first is busy), not one per call.
    assert 1 <= facts["started"] <= 2 and facts["ran_there"] and facts["pools"] == 1, facts


def test_a_parallel_call_inside_anothers_loop_with_one_configuration(tmp_path):
    """Both get the same backend object from one parallel_config: each keeps its pool until
    it ends, and a managed Parallel goes on after a call beside it, and after an error."""
    facts, _ = run('''
        with parallel_config(backend="pool", n_jobs=2):
            outer = []
            for value in Parallel(return_as="generator", batch_size=1)(
                    delayed(square)(i) for i in range(6)):
                outer.append(value)
                outer.append(sum(Parallel()(delayed(square)(i) for i in range(3))))
            with Parallel() as managed:
                first = managed(delayed(square)(i) for i in range(4))
                beside = Parallel()(delayed(square)(i) for i in range(2))
                try:
                    managed(delayed(fail_at)(i, 2) for i in range(4))
                except ValueError:
                    pass
                again = managed(delayed(square)(i) for i in range(4))
        report(outer=outer, first=first, beside=beside, again=sorted(again),
               pools=len(pool.joblib._pools))
    ''', tmp_path)
    assert facts["outer"] == [v for i in range(6) for v in (i * i, 5)]
    assert facts["first"] == [0, 1, 4, 9] and facts["beside"] == [0, 1]
    assert facts["pools"] == 1


def test_a_method_and_its_objects_large_array_go_once_per_batch(tmp_path):
    facts, _ = run('''
        import numpy as np
        from pool._wire.picklers import dumps_by_value  # (the pickler batches go with)
        from pool._worker.batches import Batch
        class Model:
            def __init__(self):
                self.weights = np.ones(1 << 20)  # 8 MiB
            def score(self, x):
                return float(self.weights[0] * x)
        model = Model()
        batch = Batch([(model.score, (i,), {}) for i in range(10)])
        size = len(dumps_by_value(batch))
        with parallel_config(backend="pool", n_jobs=2):
            scores = Parallel(batch_size=10)(delayed(model.score)(i) for i in range(10))
        report(size_mib=size / (1 << 20), scores=scores)
    ''', tmp_path)
    assert facts["scores"] == [float(i) for i in range(10)]
    assert facts["size_mib"] < 9, facts  # one copy of the weights, not ten


def test_a_script_that_runs_parallel_at_its_top_level_is_told_how_to_fix_it(tmp_path):
    """forkserver and spawn workers import the script, and would run its top level again
    (loky's do not import it): refused at the Parallel call, in joblib's words; with
    start_method="fork" it runs."""
    script = tmp_path / "top.py"
    script.write_text(textwrap.dedent('''
        import sys
        import pool.joblib
        from joblib import Parallel, delayed, parallel_config
        with parallel_config(backend="pool", n_jobs=2, start_method=sys.argv[1]):
            print(Parallel()(delayed(abs)(-i) for i in range(4)))
    '''))
    refused = subprocess.run([sys.executable, str(script), "forkserver"], capture_output=True,
                             text=True, timeout=60, cwd=str(tmp_path))
    forked = subprocess.run([sys.executable, str(script), "fork"], capture_output=True,
                            text=True, timeout=60, cwd=str(tmp_path))
    assert refused.returncode == 1 and refused.stdout == ""
    assert "outside 'if __name__ == \"__main__\":'" in refused.stderr
    assert "give parallel_config start_method='fork'" in refused.stderr
    assert forked.stdout == "[0, 1, 2, 3]\n", forked.stderr


def test_the_guide_example_runs_as_written(tmp_path):
    # docs/guide/joblib.rst's example (tests/test_readme.py runs the others).
    out = run_guide_example("joblib.rst", "pool.joblib", tmp_path)
    assert out.splitlines() == ["SIGSEGV {'alpha': 0.3}", "{'alpha': 0.1}"], out

"""``pool.patch()`` and the start-up hook ``python -m pool run`` sets up: which names it
changes, what undoing gives back, and that patching imports nothing until the class is
looked up. (``python -m pool run`` itself: test_cli_program.py.)"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process as process_module
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pool
from pool import _patch
from pool._patched import ProcessPoolExecutor as PATCHED

STDLIB_CLASS = process_module.ProcessPoolExecutor
STARTUP_DIRECTORY = str(Path(pool.__file__).parent / "_startup")


def stdlib_names() -> tuple[object, object]:
    return concurrent.futures.ProcessPoolExecutor, process_module.ProcessPoolExecutor


def test_patch_gives_both_names_pools_class_and_undo_gives_them_back():
    assert stdlib_names() == (STDLIB_CLASS, STDLIB_CLASS)
    patched = pool.patch()
    try:
        assert stdlib_names() == (PATCHED, PATCHED)
        from concurrent.futures import ProcessPoolExecutor
        assert ProcessPoolExecutor is PATCHED

        class Subclass(concurrent.futures.ProcessPoolExecutor):
            pass
        assert issubclass(Subclass, pool.ProcessPoolExecutor)
    finally:
        patched.undo()
    assert stdlib_names() == (STDLIB_CLASS, STDLIB_CLASS)
    assert "__getattr__" not in vars(process_module)   # nothing of the patch is left
    assert repr(patched) == "<pool.Patch undone>"


def test_nested_patches_undo_in_turn_and_undoing_twice_does_nothing():
    with pool.patch() as outer:
        inner = pool.patch()
        inner.undo()
        inner.undo()
        assert stdlib_names() == (PATCHED, PATCHED)
        assert repr(outer) == "<pool.Patch active>"
    assert stdlib_names() == (STDLIB_CLASS, STDLIB_CLASS)
    outer.undo()
    assert stdlib_names() == (STDLIB_CLASS, STDLIB_CLASS)


def test_a_patched_pool_is_pools(tmp_path):
    # What a library that builds its own pool gets: a worker's death fails one task.
    proc = run_python("""
        import concurrent.futures, os, signal
        import pool

        def work(n):
            if n == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return n

        if __name__ == "__main__":
            pool.patch()
            with concurrent.futures.ProcessPoolExecutor(2) as executor:
                futures = [executor.submit(work, n) for n in range(4)]
                for future in futures:
                    exc = future.exception()
                    print(type(exc).__name__ if exc else future.result())
        """, tmp_path)
    assert proc.stdout.split() == ["0", "WorkerDied", "2", "3"], proc.stderr


def run_python(code: str, tmp_path: Path, *, hook: bool = False,
               key: str | None = None, pythonpath: list[str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` as a script in a child interpreter; with ``hook``, as ``python -m
    pool run`` starts one (the start-up directory first on PYTHONPATH, POOL_PATCH set)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    environment = dict(os.environ)
    environment.pop(_patch.ENVIRONMENT_VARIABLE, None)
    if hook:
        environment["PYTHONPATH"] = os.pathsep.join([STARTUP_DIRECTORY, *(pythonpath or [])])
        environment[_patch.ENVIRONMENT_VARIABLE] = key or _patch.interpreter_key()
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path), env=environment)


FACTS = """
    import json, sys
    def facts(**more):
        import concurrent.futures.process as process_module
        print(json.dumps(dict(more,
            patched=process_module.ProcessPoolExecutor.__module__ == "pool._patched",
            executor_imported="pool._patched" in sys.modules,
            startup_on_path=any(entry.endswith("_startup") for entry in sys.path),
            finder_left=any(type(finder).__name__ == "_PatchWhenImported"
                            and finder._module_name == "concurrent.futures.process"
                            for finder in sys.meta_path),
            loader=type(process_module.__loader__).__name__,
            sitecustomize=getattr(sys.modules.get("sitecustomize"), "__file__", None))))
"""


def with_facts(code: str) -> str:
    return textwrap.dedent(FACTS) + textwrap.dedent(code)


def test_the_startup_hook_patches_when_the_module_is_imported_and_imports_nothing_before(
        tmp_path):
    proc = run_python(with_facts("""
        before = "concurrent.futures.process" in sys.modules
        import concurrent.futures.process
        imported = [name for name in sys.modules if name.split(".")[0] == "pool"]
        facts(before=before, imported=imported)
        """), tmp_path, hook=True)
    facts = json.loads(proc.stdout)
    assert facts == dict(facts, before=False, imported=[], patched=True,
                         executor_imported=True, startup_on_path=False, finder_left=False,
                         loader="SourceFileLoader"), proc.stderr
    assert proc.stderr == ""


def test_the_startup_hook_lets_pool_import_its_errors_first(tmp_path):
    # pool._errors imports concurrent.futures.process: the patch must not import the
    # executor (which needs pool._errors) while that import is under way.
    proc = run_python("""
        import pool
        print(pool.WorkerDied.__mro__[1].__name__)
        import concurrent.futures
        print(concurrent.futures.ProcessPoolExecutor.__module__ == "pool._patched")
        """, tmp_path, hook=True)
    assert proc.stdout.split() == ["BrokenProcessPool", "True"], proc.stderr


def test_the_startup_hook_does_nothing_for_another_interpreter(tmp_path):
    proc = run_python(with_facts("facts()"), tmp_path, hook=True,
                      key=f"{sys.version_info[0]}.{sys.version_info[1]}:/another/prefix")
    facts = json.loads(proc.stdout)
    assert (facts["patched"], facts["finder_left"], facts["startup_on_path"]) == (
        False, False, False)
    assert proc.stderr == ""


def test_the_startup_hook_runs_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.other_sitecustomize_ran = True\n")
    proc = run_python(with_facts("""
        facts(other_ran=getattr(sys, "other_sitecustomize_ran", False))
        """), tmp_path, hook=True, pythonpath=[str(other)])
    facts = json.loads(proc.stdout)
    assert facts["other_ran"] and facts["patched"], proc.stderr
    assert facts["sitecustomize"] == str(other / "sitecustomize.py")


def test_the_startup_hook_reports_an_error_of_the_sitecustomize_it_shadows_as_site_does(
        tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('broken sitecustomize')\n")
    plain = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                           text=True, timeout=60, cwd=str(tmp_path),
                           env=dict(os.environ, PYTHONPATH=str(other)))
    hooked = run_python(with_facts("facts()"), tmp_path, hook=True, pythonpath=[str(other)])
    assert "broken sitecustomize" in plain.stderr and plain.stdout == "ran\n"
    assert "broken sitecustomize" in hooked.stderr
    assert json.loads(hooked.stdout)["patched"]


def test_the_startup_hook_patches_at_once_when_the_module_is_imported_already(tmp_path):
    # (As when a .pth file imported it: run the hook by hand, after the import.)
    proc = run_python(with_facts(f"""
        import concurrent.futures.process, os, runpy, types
        sys.modules["sitecustomize"] = types.ModuleType("sitecustomize")
        os.environ["POOL_PATCH"] = {_patch.interpreter_key()!r}
        runpy.run_path({str(Path(STARTUP_DIRECTORY) / "sitecustomize.py")!r},
                       run_name="sitecustomize")
        facts()
        """), tmp_path)
    facts = json.loads(proc.stdout)
    assert facts["patched"] and not facts["finder_left"], proc.stderr


def test_the_startup_hook_does_nothing_when_imported_as_part_of_pool(tmp_path):
    # (Tools that import every module: pytest --doctest-modules, sphinx, pdoc.)
    proc = run_python(with_facts("""
        import pool._startup.sitecustomize
        facts()
        """), tmp_path, hook=False)
    facts = json.loads(proc.stdout)
    assert not facts["patched"] and not facts["finder_left"], proc.stderr


def test_the_startup_hook_survives_a_find_spec_before_the_import(tmp_path):
    proc = run_python(with_facts("""
        import importlib.util
        assert importlib.util.find_spec("concurrent.futures.process") is not None
        import concurrent.futures.process
        facts()
        """), tmp_path, hook=True)
    facts = json.loads(proc.stdout)
    assert facts["patched"] and not facts["finder_left"], proc.stderr


def test_a_program_with_a_module_of_its_own_named_pool_keeps_it(tmp_path):
    (tmp_path / "pool.py").write_text("def make():\n    return 'my own pool'\n")
    proc = run_python("""
        import pool
        print(pool.make())
        import concurrent.futures
        print(concurrent.futures.ProcessPoolExecutor.__module__)
        """, tmp_path, hook=True)
    assert proc.stdout == "my own pool\nconcurrent.futures.process\n", proc.stderr
    assert proc.stderr == ("pool: this program has a module of its own named pool, so its "
                           "process pools stay the stdlib's (python -m pool run cannot "
                           "import pool's)\n")


def test_a_pool_py_of_the_programs_own_imported_after_the_lookup_is_its_own(tmp_path):
    # The program's directory comes first on sys.path: its pool.py is what "import pool"
    # gives it, so the hook leaves the name to it (and says so) rather than take it.
    (tmp_path / "pool.py").write_text("def make():\n    return 'my own pool'\n")
    proc = run_python("""
        import concurrent.futures
        print(concurrent.futures.ProcessPoolExecutor.__module__)
        import pool
        print(pool.make())
        """, tmp_path, hook=True)
    assert proc.stdout == "concurrent.futures.process\nmy own pool\n", proc.stderr
    assert "has a module of its own named pool" in proc.stderr


def test_the_hook_finds_pool_where_it_is_when_the_program_cannot_import_it(tmp_path):
    # (As when pool run is started from a source tree that is not installed: here,
    # a program whose path leaves site-packages out.)
    proc = run_python("""
        import sys
        sys.path[:] = [entry for entry in sys.path if "-packages" not in entry]
        sys.meta_path[:] = [finder for finder in sys.meta_path   # (an editable install's)
                            if "editable" not in getattr(finder, "__module__", "")]
        import concurrent.futures
        print(concurrent.futures.ProcessPoolExecutor.__module__)
        """, tmp_path, hook=True)
    assert proc.stdout == "pool._patched\n", proc.stderr


def test_the_startup_hook_starts_the_program_with_standard_error_closed(tmp_path):
    code = "import concurrent.futures as f; print(f.ProcessPoolExecutor.__module__)"
    for key in (_patch.interpreter_key(), "3.0:/another/python"):
        proc = subprocess.run(
            ["sh", "-c", f'POOL_RUN_PID=$$ exec "{sys.executable}" -c "{code}" 2>&-'],
            capture_output=True, text=True, timeout=60, cwd=str(tmp_path), env=dict(
                os.environ, PYTHONPATH=STARTUP_DIRECTORY, POOL_PATCH=key))
        assert proc.returncode == 0, proc.stdout
        assert proc.stdout == ("pool._patched\n" if key == _patch.interpreter_key()
                               else "concurrent.futures.process\n")


def test_the_startup_hook_and_pool_run_name_this_interpreter_alike(tmp_path):
    code = ('import sys; print("%d.%d%s:%s" % (sys.version_info[0], sys.version_info[1], '
            'getattr(sys, "abiflags", ""), sys.prefix))')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))
    assert proc.stdout.strip() == _patch.interpreter_key()
    source = (Path(STARTUP_DIRECTORY) / "sitecustomize.py").read_text()
    assert ('key = "%d.%d%s:%s" % (sys.version_info[0], sys.version_info[1],\n'
            '                          getattr(sys, "abiflags", ""), sys.prefix)') in source


@pytest.mark.parametrize("name", ["concurrent.futures", "concurrent.futures.process"])
def test_patching_keeps_what_a_name_looked_up_before_gives(name, tmp_path):
    # The package's global exists only once something looked it up: undo must put back
    # exactly what was there (nothing, or the stdlib class).
    proc = run_python(f"""
        import concurrent.futures, concurrent.futures.process, importlib
        import pool
        module = importlib.import_module({name!r})
        module.ProcessPoolExecutor   # (looked up once before the patch)
        looked_up = "ProcessPoolExecutor" in vars(concurrent.futures)
        with pool.patch():
            inside = module.ProcessPoolExecutor.__module__ == "pool._patched"
        after = module.ProcessPoolExecutor is concurrent.futures.process.__dict__[
            "ProcessPoolExecutor"]
        left = "ProcessPoolExecutor" in vars(concurrent.futures)
        print(looked_up, inside, after, left)
        """, tmp_path)
    # (3.15's package holds the name from its import on: an explicit lazy import.)
    if name == "concurrent.futures" or sys.version_info >= (3, 15):
        assert proc.stdout.split() == ["True", "True", "True", "True"], proc.stderr
    else:
        assert proc.stdout.split() == ["False", "True", "True", "False"], proc.stderr


def test_undo_leaves_a_name_someone_else_replaced_since():
    class Other:
        pass
    patched = pool.patch()
    process_module.ProcessPoolExecutor = Other
    try:
        patched.undo()
        assert process_module.ProcessPoolExecutor is Other
    finally:
        process_module.ProcessPoolExecutor = STDLIB_CLASS
    assert stdlib_names() == (STDLIB_CLASS, STDLIB_CLASS)


def test_the_patched_class_takes_the_stdlibs_start_method_when_given_none():
    import multiprocessing
    for kwargs, method in [({}, multiprocessing.get_start_method()),
                           ({"max_tasks_per_child": 3}, "spawn"),
                           ({"mp_context": multiprocessing.get_context("forkserver")},
                            "forkserver")]:
        stdlib = STDLIB_CLASS(1, **kwargs)
        patched = PATCHED(1, **kwargs)
        try:
            assert patched._mp_context.get_start_method() == method
            assert stdlib._mp_context.get_start_method() == method
        finally:
            stdlib.shutdown()
            patched.shutdown()
    assert issubclass(PATCHED, pool.ProcessPoolExecutor)


def test_the_patched_class_takes_the_start_method_the_program_set(tmp_path):
    proc = run_python("""
        import multiprocessing
        from pool._patched import ProcessPoolExecutor
        if __name__ == "__main__":
            multiprocessing.set_start_method("spawn")
            executor = ProcessPoolExecutor(1)
            print(executor._mp_context.get_start_method())
            executor.shutdown()
        """, tmp_path)
    assert proc.stdout == "spawn\n", proc.stderr


def test_tqdms_process_map_counts_every_task_on_the_patched_class(tmp_path):
    # tqdm passes a lock of the default context in initargs (fork before 3.14): pool's
    # own default, forkserver, could not take it; the patched class keeps the stdlib's.
    proc = run_python("""
        import pool

        def square(n):
            return n * n

        if __name__ == "__main__":
            pool.patch()
            from tqdm.contrib.concurrent import process_map
            print(process_map(square, range(9), max_workers=2, chunksize=1, mininterval=0))
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[0, 1, 4, 9, 16, 25, 36, 49, 64]\n"
    assert "9/9" in proc.stderr


# -- multiprocessing.Pool ----------------------------------------------------------------

import multiprocessing.pool as mp_pool_module  # noqa: E402

STDLIB_POOL = mp_pool_module.Pool


def test_patch_makes_every_multiprocessing_pool_pools_and_leaves_thread_pool_alone():
    import multiprocessing
    with pool.patch():
        stand_in = mp_pool_module.Pool
        assert stand_in is not STDLIB_POOL and issubclass(stand_in, STDLIB_POOL)
        made = [multiprocessing.Pool(1), mp_pool_module.Pool(1),
                multiprocessing.get_context("spawn").Pool(1)]
        try:
            for p in made:
                assert isinstance(p, pool.Pool) and isinstance(p, STDLIB_POOL)
                assert type(p).__module__ == "pool._patched"
            assert made[0]._ctx is multiprocessing.get_context()  # the stdlib's default
            assert made[2]._ctx.get_start_method() == "spawn"
            assert made[2].map(abs, [-1, -2]) == [1, 2]
        finally:
            for p in made:
                p.terminate()
                p.join()
        with mp_pool_module.ThreadPool(2) as threads:
            assert type(threads) is mp_pool_module.ThreadPool
            assert threads.map(abs, [-3]) == [3]
        threads.join()

        class Subclass(mp_pool_module.Pool):  # a subclass keeps the stdlib's engine
            pass
        assert issubclass(Subclass, STDLIB_POOL) and not issubclass(Subclass, pool.Pool)
    assert mp_pool_module.Pool is STDLIB_POOL


def test_undo_leaves_a_multiprocessing_pool_someone_else_replaced_since():
    patch = pool.patch()
    theirs = type("Pool", (STDLIB_POOL,), {})
    mp_pool_module.Pool = theirs
    try:
        patch.undo()
        assert mp_pool_module.Pool is theirs
    finally:
        mp_pool_module.Pool = STDLIB_POOL


def test_the_startup_hook_patches_multiprocessing_pool_and_imports_pool_at_the_first_pool(
        tmp_path):
    proc = run_python("""
        import json, multiprocessing, sys
        import multiprocessing.pool
        if __name__ == "__main__":
            before = [name for name in sys.modules if name.split(".")[0] == "pool"]
            stand_in = multiprocessing.pool.Pool
            with multiprocessing.Pool(1) as p:
                kind = type(p).__module__ + "." + type(p).__qualname__
                squares = p.map(abs, [-1, -2])
            thread_pool = multiprocessing.pool.ThreadPool.__mro__[1] is not stand_in
            print(json.dumps(dict(before=before, squares=squares, kind=kind,
                                  stand_in_of_the_stdlibs=stand_in.__mro__[1].__module__,
                                  thread_pool=thread_pool)))
        """, tmp_path, hook=True)
    facts = json.loads(proc.stdout)
    assert facts == dict(before=[], squares=[1, 2], kind="pool._patched.Pool",
                         stand_in_of_the_stdlibs="multiprocessing.pool", thread_pool=True), \
        proc.stderr

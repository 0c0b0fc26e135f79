"""Real programs that build their own ``ProcessPoolExecutor`` or ``multiprocessing.Pool``,
run as they are and under ``python -m pool run``: black, compileall, tqdm's
``process_map`` and dask's processes scheduler; flake8 and isort. Run by tox's ``clients``
environment, not the core matrix.

Each program runs twice, each time in its own copy of the same directory: the outputs,
exit statuses and files it leaves must be the same. A probe (a ``sitecustomize`` on
``PYTHONPATH``: under ``pool run``, the start-up hook runs it after itself) records whether
the program's own process looked up pool's class, so that "the same" cannot come from
pool not being there. A task that kills its worker is one explained failure under pool.
``pytest -s`` prints each comparison side by side.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from helpers import communicate_or_kill

# A program's first run in a fresh environment compiles and imports a lot (dask, numpy).
pytestmark = pytest.mark.timeout(300)

RUNNERS = {"stdlib": [], "pool": [sys.executable, "-m", "pool", "run"]}

PROBE = """\
import atexit, os, sys

def _record():
    with open(os.environ["CLIENT_PROBE_FILE"], "a") as probe:
        probe.write("%d %s\\n" % (os.getpid(), "pool._patched" in sys.modules))

atexit.register(_record)
"""


@dataclass
class Ran:
    status: int
    stdout: str
    stderr: str
    pool_class_used: bool
    directory: Path

    def text(self, stream: str) -> str:
        """The stream, with this run's directory written ``DIR``."""
        return getattr(self, stream).replace(str(self.directory), "DIR")


def run_both(command: list[str], tmp_path: Path, build: Callable[[Path], None],
             **environment: str) -> dict[str, Ran]:
    """Runs ``command`` as it is and under ``python -m pool run``, each in a fresh copy of
    what ``build`` makes."""
    runs = {}
    for name, prefix in RUNNERS.items():
        directory = tmp_path / name
        directory.mkdir()
        build(directory)
        probe = tmp_path / f"{name}-probe"
        probe.mkdir()
        (probe / "sitecustomize.py").write_text(PROBE)
        probe_file = tmp_path / f"{name}-probe.txt"
        env = dict(os.environ, PYTHONPATH=str(probe), CLIENT_PROBE_FILE=str(probe_file),
                   BLACK_CACHE_DIR=str(tmp_path / f"{name}-black-cache"),
                   NO_COLOR="1", COLUMNS="80", **environment)
        env.pop("POOL_PATCH", None)
        proc = subprocess.Popen([*prefix, *command], cwd=str(directory), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        status, out, err = communicate_or_kill(proc, 240)
        records = dict(line.split() for line in probe_file.read_text().splitlines())
        runs[name] = Ran(status, out, err, records.get(str(proc.pid)) == "True", directory)
    assert not runs["stdlib"].pool_class_used
    assert runs["pool"].pool_class_used, runs["pool"].stderr
    return runs


def show(title: str, runs: dict[str, Ran], stream: str = "stdout") -> None:
    """Side by side, for ``pytest -s`` (and the closing notes that quote it)."""
    print(f"\n=== {title}: {stream} and exit status")
    for name, ran in runs.items():
        print(f"--- {name} (exit {ran.status})")
        print(textwrap.indent(ran.text(stream).rstrip("\n"), "    "))


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def source_tree(directory: Path) -> None:
    """Python files to format or compile, one of which does not parse."""
    tree = directory / "tree"
    (tree / "sub").mkdir(parents=True)
    for n in range(5):
        (tree / f"module{n}.py").write_text(f"x = [1,2 ,{n}]\ndef f( a ):\n  return a\n")
        (tree / "sub" / f"formatted{n}.py").write_text(f"y = {n}\n")
    (tree / "broken.py").write_text("def broken(:\n    pass\n")


def test_black_with_two_workers_and_a_file_that_does_not_parse(tmp_path):
    # (The console script pip wrote beside this Python: what a user types as "black".)
    black = shutil.which("black", path=str(Path(sys.executable).parent))
    assert black, "the clients environment installs black"
    runs = run_both([black, "--workers", "2", "tree"], tmp_path, source_tree)
    show("black --workers 2 tree", runs, "stderr")
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 123
    # (One line per file, in the order the workers finish them.)
    assert sorted(stdlib.text("stderr").splitlines()) == sorted(
        pooled.text("stderr").splitlines())
    assert "error: cannot parse: DIR/tree/broken.py:1:11" in pooled.text("stderr")
    assert "5 files reformatted, 5 files left unchanged, 1 file failed to reformat." in (
        pooled.stderr)
    assert files_of(stdlib.directory / "tree") == files_of(pooled.directory / "tree")


def test_compileall_with_two_workers(tmp_path):
    runs = run_both([sys.executable, "-m", "compileall", "-q", "-j", "2", "tree"], tmp_path,
                    source_tree)
    show("python -m compileall -q -j 2 tree", runs)
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 1
    assert stdlib.stdout == pooled.stdout and "*** Error compiling 'tree/broken.py'" in (
        pooled.stdout)
    assert stdlib.stderr == pooled.stderr == ""
    compiled = {name for name in files_of(stdlib.directory) if name.endswith(".pyc")}
    assert len(compiled) == 10
    assert compiled == {name for name in files_of(pooled.directory) if name.endswith(".pyc")}


def lint_tree(directory: Path) -> None:
    """Python files with style faults and unsorted imports, one of which does not parse."""
    tree = directory / "tree"
    (tree / "sub").mkdir(parents=True)
    for n in range(6):
        (tree / f"module{n}.py").write_text(
            f"import sys\nimport os\nx = [1,2 ,{n}]\ndef f( a ):\n  return os, sys, a\n")
        (tree / "sub" / f"clean{n}.py").write_text(f"import os\n\nY = os.sep * {n}\n")
    (tree / "broken.py").write_text("def broken(:\n    pass\n")


def console_script(name: str) -> str:
    # (The console script pip wrote beside this Python: what a user types.)
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    assert path, f"the clients environment installs {name}"
    return path


def test_flake8_with_two_jobs(tmp_path):
    # flake8 -j runs its checks on a multiprocessing.Pool (imap_unordered, then close and
    # join): under pool run, pool's.
    runs = run_both([console_script("flake8"), "-j", "2", "tree"], tmp_path, lint_tree)
    show("flake8 -j 2 tree", runs)
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 1
    assert stdlib.stdout == pooled.stdout and "tree/module3.py:3:7: E231" in pooled.stdout
    assert "tree/broken.py:1:13: E999 SyntaxError" in pooled.stdout
    assert stdlib.stderr == pooled.stderr == ""


def test_isort_with_two_jobs(tmp_path):
    # isort --jobs sorts files on a multiprocessing.Pool (imap, in a with block).
    # Unbuffered: the workers print "Fixing ...", and a worker ended by the pool's
    # terminate() at the with's exit (both pools do that) loses what it had buffered: on a
    # pipe, that is all of it, or none, as the timing falls.
    runs = run_both([console_script("isort"), "--jobs", "2", "tree"], tmp_path, lint_tree,
                    PYTHONUNBUFFERED="1")
    show("isort --jobs 2 tree", runs)
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 0
    # One "Fixing" per file, in the order the workers finish them; each worker writes the
    # line and its end apart, so two workers' lines may run together (with both pools).
    fixed = [sorted(re.findall(r"Fixing (\S+?\.py)", ran.text("stdout"))) for ran in runs.values()]
    assert fixed[0] == fixed[1] == [f"DIR/tree/module{n}.py" for n in range(6)]
    assert stdlib.stderr == pooled.stderr
    sorted_files = files_of(pooled.directory / "tree")
    assert sorted_files == files_of(stdlib.directory / "tree")
    assert sorted_files["module0.py"].startswith(b"import os\nimport sys\n")


def script(text: str) -> Callable[[Path], None]:
    def build(directory: Path) -> None:
        (directory / "program.py").write_text(textwrap.dedent(text))
    return build


def test_tqdms_process_map(tmp_path):
    runs = run_both([sys.executable, "program.py"], tmp_path, script("""
        from tqdm.contrib.concurrent import process_map

        def square(n):
            return n * n

        if __name__ == "__main__":
            print(process_map(square, range(9), max_workers=2, chunksize=1, ncols=60,
                              mininterval=0))
        """))
    show("tqdm process_map", runs)
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 0
    assert stdlib.stdout == pooled.stdout == "[0, 1, 4, 9, 16, 25, 36, 49, 64]\n"
    # The bar's last state (its rate differs from run to run).
    for ran in runs.values():
        assert re.search(r"100%\|█+\| 9/9 \[", ran.stderr.rsplit("\r", 1)[-1]), ran.stderr


DASK_PROGRAM = """
    import dask
    import dask.array as da
    import dask.bag as db

    def inc(x):
        return x + 1

    if __name__ == "__main__":
        dask.config.set(scheduler="processes", num_workers=2)
        bag = db.from_sequence(range(100), npartitions=8)
        print(bag.map(inc).filter(lambda x: x % 3 == 0).sum().compute())
        print(sorted(bag.foldby(lambda x: x % 7, lambda total, x: total + x, 0).compute()))
        array = da.arange(10_000, chunks=1_000).reshape(100, 100)
        print((array.T @ array).sum().compute(), array.mean(axis=0)[:3].compute().tolist())
    """


def test_dasks_processes_scheduler_with_a_bag_and_an_array(tmp_path):
    runs = run_both([sys.executable, "program.py"], tmp_path, script(DASK_PROGRAM))
    show("dask processes scheduler", runs)
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 0, pooled.stderr
    assert stdlib.stdout == pooled.stdout == (
        "1683\n[(0, 735), (1, 750), (2, 665), (3, 679), (4, 693), (5, 707), (6, 721)]\n"
        "33327500250000 [4950.0, 4951.0, 4952.0]\n")
    assert stdlib.stderr == pooled.stderr == ""


def test_a_dask_task_that_kills_its_worker_is_one_explained_failure_under_pool(tmp_path):
    runs = run_both([sys.executable, "program.py"], tmp_path, script("""
        import os, signal, sys
        import dask
        import dask.bag as db

        def inc(x):
            if x == 7:
                os.kill(os.getpid(), signal.SIGKILL)   # as the OOM killer would
            return x + 1

        if __name__ == "__main__":
            dask.config.set(scheduler="processes", num_workers=2)
            try:
                print(db.from_sequence(range(20), npartitions=10).map(inc).sum().compute())
            except Exception as exc:
                print(f"{type(exc).__name__}: {exc}")
                sys.exit(1)
        """))
    show("a dask task that SIGKILLs its worker", runs)
    show("a dask task that SIGKILLs its worker", runs, "stderr")
    stdlib, pooled = runs["stdlib"], runs["pool"]
    assert stdlib.status == pooled.status == 1
    # The stdlib says one of two things, by when its manager thread saw the death: for
    # the futures it failed then, or for a submit after it had marked the pool broken.
    assert stdlib.stdout in (
        "BrokenProcessPool: A process in the process pool was terminated abruptly while "
        "the future was running or pending.\n",
        "BrokenProcessPool: A child process terminated abruptly, the process pool is not "
        "usable anymore\n")
    first, reason = pooled.stdout.splitlines()
    assert re.fullmatch(r"WorkerDied: worker pid \d+ died \(signal SIGKILL \(9\)\) while "
                        r"running task \d+: dask\.local\.batch_execute_tasks\(\[\(\("
                        r"'from_sequence-inc-sum-part-.{,200}\)", first), first
    assert reason.startswith("The process was killed from outside (SIGKILL")
    # One death, one failure, logged once.
    assert pooled.stderr.count("that task failed with WorkerDied") == 1, pooled.stderr

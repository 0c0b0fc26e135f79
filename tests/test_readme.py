"""The Python examples of README.rst and of the documentation pages (docs/) run as written:
each is saved as a script and run in a child interpreter (the installed pool, a hard
timeout), and what it prints is checked against what the page says it prints. Which
blocks are examples: tests/doc_examples.py. The one that needs dask runs in tests/dask, the
one that needs joblib in tests/joblib."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from doc_examples import REPO_DIR, literal_blocks_after, page_name, pages, programs

ALL_EXAMPLES = {(page_name(page), index): program for page in pages()
                for index, program in enumerate(programs(page))}
# The dask example needs distributed: tests/dask/test_dask.py runs it, in tox's dask env;
# the joblib one needs joblib and scikit-learn: tests/joblib, in tox's joblib env.
EXAMPLES = {key: program for key, program in ALL_EXAMPLES.items()
            if "pool.dask" not in program and "pool.joblib" not in program}

# What each example must print (its page says so next to it), in order. A new example
# needs its line here: what it prints, or [] if the page claims nothing.
EXPECTED = {
    ("README.rst", 0): [
        r"^0$", r"^1$", r"^worker pid \d+ died \(signal SIGSEGV \(11\)\) while running "
        r"task 3: __main__\.work\(2\)$", r"^Fatal Python error: Segmentation fault$",
        r"line \d+ in work$", r"^9$", r"^16$"],
    ("README.rst", 1): [
        r"^0$", r"^1$", r"^worker pid \d+ died \(exit code 3\) while running task 3: "
        r"__main__\.work\(2\)$", r"^9$"],
    ("docs/guide/using.rst", 0): [r"^100$"],
    ("docs/guide/using.rst", 1): [
        r"^<PoolStats 2 running, 1 queued, 1 completed; 2 workers \(2 started\)>$",
        r"^WARNING pool: pool-dispatcher-1: worker pid \d+ died \(signal SIGKILL \(9\)\) "
        r"while running task 2: __main__\.work\(60\); that task failed with WorkerDied$",
        r"^worker pid \d+ died \(signal SIGKILL \(9\)\) while running task 2: "
        r"__main__\.work\(60\)",
        r"^<PoolStats 0 running, 0 queued, 3 completed, 1 failed; "
        r"2 workers \(3 started, 1 died: SIGKILL x1\)>$"],
    ("docs/guide/using.rst", 2): [r"^500 500$"],
    ("docs/guide/mp_pool.rst", 0): [
        r"^0 0$", r"^1 1$", r"^2 4$", r"^3 WorkerDied: worker pid \d+ died \(signal SIGSEGV "
        r"\(11\)\) while running task 4: __main__\.work\(3\)$", r"^4 16$", r"^5 25$"],
    ("docs/guide/shared.rst", 0): [r"^5$", r"^4$", r"^\{'max_workers': \('2', '3'\)\}$"],
    ("docs/guide/asyncio.rst", 0): [
        r"^49$", r"^\[0, 1, 4, 9, 16\]$", r"^worker pid \d+ died \(signal SIGKILL \(9\)\) "
        r"while running task 7: __main__\.killed\(\)$", r"^timed out$", r"^stopped$",
        r"^144$"],
    ("docs/guide/run.rst", 0): [  # run as written, on the stdlib; under pool run: below
        r"^0 0$", r"^2 BrokenProcessPool: A process in the process pool was terminated "
        r"abruptly"],
    ("docs/guide/run.rst", 1): [  # run as written, on the stdlib; under pool run: below
        r"^0 0$", r"^2 4$", r"^3 TimeoutError $", r"^4 16$", r"^5 25$"],
    ("docs/guide/run.rst", 2): [
        r"^<class 'pool\._patched\.ProcessPoolExecutor'>$", r"^True$",
        r"^<class 'concurrent\.futures\.process\.ProcessPoolExecutor'>$"],
}
SQUARES = ("docs/guide/run.rst", 0)
TILES = ("docs/guide/run.rst", 1)


def test_every_example_says_what_it_prints():
    assert sorted(EXAMPLES) == sorted(EXPECTED)
    assert len(ALL_EXAMPLES) - len(EXAMPLES) == 2   # the dask one and the joblib one


@pytest.mark.parametrize("key", sorted(EXAMPLES), ids=lambda key: f"{key[0]}-{key[1]}")
def test_an_example_runs_as_written(key, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[key])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=90, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = iter(proc.stdout.splitlines())
    for pattern in EXPECTED[key]:  # each in order, other lines allowed between them
        assert any(re.search(pattern, line) for line in lines), (pattern, proc.stdout)


def test_the_pool_run_example_prints_what_its_page_shows(tmp_path):
    # The page shows squares.py's output on the stdlib, then under python -m pool run.
    script = tmp_path / "squares.py"
    script.write_text(EXAMPLES[SQUARES])
    stdlib_lines, pool_lines = literal_blocks_after(REPO_DIR / SQUARES[0],
                                                    EXAMPLES[SQUARES])[:2]
    outputs = [subprocess.run([*prefix, str(script)], capture_output=True, text=True,
                              timeout=90, cwd=str(tmp_path)).stdout.splitlines()
               for prefix in ([sys.executable], [sys.executable, "-m", "pool", "run"])]
    assert outputs[0] == stdlib_lines
    assert [re.sub(r"pid \d+", "pid N", line) for line in outputs[1]] == [
        re.sub(r"pid \d+", "pid N", line) for line in pool_lines]


def test_the_multiprocessing_pool_example_prints_what_its_page_shows(tmp_path):
    # As above, for tiles.py: under pool run, the death is a failure of one task, at once.
    script = tmp_path / "tiles.py"
    script.write_text(EXAMPLES[TILES])
    stdlib_lines, pool_lines = literal_blocks_after(REPO_DIR / TILES[0], EXAMPLES[TILES])[:2]
    outputs = [subprocess.run([*prefix, str(script)], capture_output=True, text=True,
                              timeout=90, cwd=str(tmp_path)).stdout.splitlines()
               for prefix in ([sys.executable], [sys.executable, "-m", "pool", "run"])]
    assert [line.rstrip() for line in outputs[0]] == stdlib_lines
    assert [re.sub(r"pid \d+", "pid N", line) for line in outputs[1]] == [
        re.sub(r"pid \d+", "pid N", line) for line in pool_lines]

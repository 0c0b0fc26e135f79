"""README.rst's Python examples run as written: each ``.. code-block:: python`` block is
saved as a script and run in a child interpreter (the installed pool, a hard timeout).
The one that needs dask runs in tests/dask instead."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO_DIR

ALL_BLOCKS = re.findall(r"^\.\. code-block:: python\n\n((?:    .*\n|\n)+)",
                        (REPO_DIR / "README.rst").read_text(), re.M)
# The dask example needs distributed: tests/dask/test_dask.py runs it, in tox's dask env.
BLOCKS = [block for block in ALL_BLOCKS if "pool.dask" not in block]

# What each example must print (README says so next to it), in order.
EXPECTED = {
    0: [r"^0$", r"^1$", r"^worker pid \d+ died \(signal SIGSEGV \(11\)\) while running "
        r"task 3: __main__\.work\(2\)$", r"^Fatal Python error: Segmentation fault$",
        r"line \d+ in work$", r"^9$", r"^16$"],
    1: [r"^100$"],
    2: [r"^<PoolStats 2 running, 1 queued, 1 completed; 2 workers \(2 started\)>$",
        r"^WARNING pool: pool-dispatcher-1: worker pid \d+ died \(signal SIGKILL \(9\)\) "
        r"while running task 2: __main__\.work\(60\); that task failed with WorkerDied$",
        r"^worker pid \d+ died \(signal SIGKILL \(9\)\) while running task 2: "
        r"__main__\.work\(60\)",
        r"^<PoolStats 0 running, 0 queued, 3 completed, 1 failed; "
        r"2 workers \(3 started, 1 died: SIGKILL x1\)>$"],
    3: [r"^500 500$"],
    4: [r"^5$", r"^4$", r"^\{'max_workers': \('2', '3'\)\}$"],
    5: [r"^49$", r"^\[0, 1, 4, 9, 16\]$", r"^worker pid \d+ died \(signal SIGKILL \(9\)\) "
        r"while running task 7: __main__\.killed\(\)$", r"^timed out$", r"^stopped$", r"^144$"],
    6: [r"^0 0$", r"^2 BrokenProcessPool: A process in the process pool was terminated "
        r"abruptly"],   # (run as written, on the stdlib; under pool run: below)
    7: [r"^<class 'pool\._patched\.ProcessPoolExecutor'>$", r"^True$",
        r"^<class 'concurrent\.futures\.process\.ProcessPoolExecutor'>$"],
}
SQUARES = 6


def test_the_readme_has_its_examples():
    assert len(BLOCKS) == len(EXPECTED)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_example_runs_as_written(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(BLOCKS[index]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=90, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = iter(proc.stdout.splitlines())
    for pattern in EXPECTED[index]:  # each in order, other lines allowed between them
        assert any(re.search(pattern, line) for line in lines), (pattern, proc.stdout)


def literal_blocks_after(block: str) -> list[list[str]]:
    """The ``::`` blocks of README that follow a code block, up to the next section."""
    text = (REPO_DIR / "README.rst").read_text()
    rest = text[text.index(block) + len(block):]
    rest = rest[:re.search(r"^\S.*\n-{4,}$", rest, re.M).start()]
    return [textwrap.dedent(found).strip("\n").splitlines() for found in
            re.findall(r"::\n\n((?:    .*\n|\n)+)", rest)]


def test_the_pool_run_example_prints_what_readme_shows(tmp_path):
    # README shows squares.py's output on the stdlib, then under python -m pool run.
    script = tmp_path / "squares.py"
    script.write_text(textwrap.dedent(BLOCKS[SQUARES]))
    stdlib_lines, pool_lines = literal_blocks_after(BLOCKS[SQUARES])[:2]
    outputs = [subprocess.run([*prefix, str(script)], capture_output=True, text=True,
                              timeout=90, cwd=str(tmp_path)).stdout.splitlines()
               for prefix in ([sys.executable], [sys.executable, "-m", "pool", "run"])]
    assert outputs[0] == stdlib_lines
    assert [re.sub(r"pid \d+", "pid N", line) for line in outputs[1]] == [
        re.sub(r"pid \d+", "pid N", line) for line in pool_lines]

"""Programs that cannot start workers fail at once, in a few lines that name the fix: a
main script that uses a pool outside ``if __name__ == "__main__":`` (spawn, forkserver),
and a pool in a daemonic process. What works with the stdlib keeps working."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import pool
from helpers import START_METHODS, TESTS_DIR

UNGUARDED = '''
import multiprocessing, sys
sys.path.insert(0, {tests!r})
import pool, tasks

with pool.ProcessPool(2, mp_context=multiprocessing.get_context({method!r})) as p:
    try:
        for i in range(3):
            print(p.submit(tasks.square, i).result(timeout=60))
    finally:
        pass
'''

# Created at the top level, used only under the guard: fine with the stdlib under every
# start method (workers re-create an unused pool, which starts nothing), so fine here.
CREATED_AT_TOP_USED_UNDER_GUARD = '''
import multiprocessing, sys
sys.path.insert(0, {tests!r})
import pool, tasks

executor = pool.ProcessPool(2, mp_context=multiprocessing.get_context({method!r}))

def main():
    print(sum(executor.map(tasks.square, range(10))))
    executor.shutdown()

if __name__ == "__main__":
    try:
        main()
    finally:
        pass
'''


def _run(tmp_path, template, method):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(template.format(tests=str(TESTS_DIR), method=method)))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))


@pytest.mark.parametrize("method", START_METHODS)
def test_a_script_without_the_main_guard_fails_at_once_naming_the_fix(method, tmp_path):
    proc = _run(tmp_path, UNGUARDED, method)
    if method == "fork":  # workers do not re-run the script: it works, as with the stdlib
        assert proc.returncode == 0 and proc.stdout.split() == ["0", "1", "4"], proc.stderr
        return
    assert proc.returncode == 1
    assert proc.stdout == ""  # no task ran, no worker started
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("RuntimeError: a process pool is used at the top level of ")
    assert "(line 9)" in lines[-1] and "if __name__ == \"__main__\":" in lines[-1]
    assert len(lines) < 20, proc.stderr  # not hundreds of lines from failing workers


@pytest.mark.parametrize("method", START_METHODS)
def test_a_pool_created_at_the_top_level_and_used_under_the_guard_works(method, tmp_path):
    proc = _run(tmp_path, CREATED_AT_TOP_USED_UNDER_GUARD, method)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["285"]


# Other shapes of the guard, and ``python -m package`` (whose __main__ module workers do
# not run again): all work with the stdlib, so they must work here.
OTHER_GUARDS = {
    "and": 'if __name__ == "__main__" and len(sys.argv) >= 1:\n    main()\n',
    "match": 'match __name__:\n    case "__main__":\n        main()\n',
    "reversed": 'if "__main__" == __name__:\n    main()\n',
}
MAIN = '''
import multiprocessing, sys
sys.path.insert(0, {tests!r})
import pool, tasks

def main():
    with pool.ProcessPool(2, mp_context=multiprocessing.get_context({method!r})) as p:
        print(sum(p.map(tasks.square, range(10))))

'''


@pytest.mark.parametrize("guard", list(OTHER_GUARDS))
def test_other_forms_of_the_guard_work(guard, tmp_path):
    proc = _run(tmp_path, MAIN + OTHER_GUARDS[guard].replace("{", "{{").replace("}", "}}"),
                "spawn")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["285"]


def test_a_package_run_with_dash_m_needs_no_guard_in_its_main_module(tmp_path):
    package = tmp_path / "tool"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(MAIN.format(tests=str(TESTS_DIR), method="spawn")
                                         + "main()\n")  # unguarded, as many are
    proc = subprocess.run([sys.executable, "-m", "tool"], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["285"]


def _make_pool_in_daemon(queue):
    try:
        pool.ProcessPool(1)
    except RuntimeError as exc:
        queue.put(str(exc))
    else:
        queue.put("no error")


def test_a_pool_in_a_daemonic_process_fails_at_once_saying_why():
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    daemon = ctx.Process(target=_make_pool_in_daemon, args=(queue,), daemon=True)
    daemon.start()
    message = queue.get()
    daemon.join(30)
    queue.close()
    assert "daemonic" in message and "daemon=False" in message
    assert "DASK_DISTRIBUTED__WORKER__DAEMON=False" in message
    assert os.getpid() != daemon.pid


POOLS_IN_A_LOOP = '''
import ast, multiprocessing, sys
sys.path.insert(0, {tests!r})
import pool, tasks

parses = []
real_parse = ast.parse
ast.parse = lambda *args, **kwargs: parses.append(args) or real_parse(*args, **kwargs)

def main():
    for i in range(3):
        with pool.ProcessPool(1, mp_context=multiprocessing.get_context({method!r})) as p:
            assert p.submit(tasks.square, i).result(timeout=60) == i * i
    print("parsed", len(parses))

if __name__ == "__main__":
    main()
'''


def test_the_main_script_is_parsed_once_for_the_pools_it_makes_from_one_line(tmp_path):
    # The guard check reads the script's syntax tree at each pool's first use: a few
    # milliseconds for a long script, paid again by every pool a loop makes.
    result = _run(tmp_path, POOLS_IN_A_LOOP, "forkserver")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["parsed", "1"]

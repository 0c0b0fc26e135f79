"""``pool.Pool``'s chunks: a worker's death or a timeout in a chunk of several items costs
one item, not the chunk. The items the worker finished are delivered, the one it was
running fails with the error that ended it, and the items after it run elsewhere, each
exactly once: every item counts its runs in a file (``tasks.counted_then``).

Each scenario runs in a child interpreter under a hard timeout (``run_script``).
"""

from __future__ import annotations

import pytest

from helpers import START_METHODS, run_script

EFFECTS = {3: "sigkill", 9: "segfault", 14: "exit", 20: "sleep", 22: "raise"}
FAILS_WITH = {3: "WorkerDied: SIGKILL", 9: "WorkerDied: SIGSEGV", 14: "WorkerDied: code 7",
              20: "TaskTimeout", 22: "ValueError"}

DEATHS_IN_CHUNKS = '''
import functools, tempfile
EFFECTS = {EFFECTS!r}

def outcome(error):
    if isinstance(error, pool.WorkerDied):
        how = ("SIGKILL" if "SIGKILL" in str(error) else "SIGSEGV" if "SIGSEGV" in str(error)
               else "code 7" if error.exitcode == 7 else str(error.exitcode))
        return "WorkerDied: " + how
    return type(error).__name__

facts = {{}}
with pool.Pool(2, context=CTX, task_timeout=3) as p:
    for name, make in (("imap", p.imap), ("imap_unordered", p.imap_unordered)):
        marks = tempfile.mkdtemp()
        run = functools.partial(tasks.counted_then, marks, EFFECTS)
        got = {{}}
        iterator = make(run, range(24), chunksize=6)
        position = 0
        while True:
            try:
                value = next(iterator)
            except StopIteration:
                break
            except Exception as error:
                got[f"failed {{position}}"] = outcome(error)
                if position == 3:
                    facts["named " + name] = str(error).splitlines()[0]
            else:
                got[str(value)] = "ok"
            position += 1
        facts[name] = got
        facts[name + " runs"] = tasks.runs_of(marks)
    marks = tempfile.mkdtemp()
    result = p.map_async(functools.partial(tasks.counted_then, marks, EFFECTS), range(24),
                         chunksize=12)
    try:
        result.get(120)
    except Exception as error:
        facts["map_async"] = outcome(error)
    facts["map_async runs"] = tasks.runs_of(marks)
report(**facts)
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", START_METHODS)
def test_a_death_or_timeout_in_a_chunk_costs_one_item_and_runs_none_twice(method, tmp_path):
    facts, _ = run_script(DEATHS_IN_CHUNKS.format(EFFECTS=EFFECTS), method, tmp_path,
                          timeout=240)
    once = {str(x): 1 for x in range(24)}
    # imap: in input order, each failure at its item's place, the rest delivered.
    assert facts["imap"] == {
        **{str(x * x): "ok" for x in range(24) if x not in EFFECTS},
        **{f"failed {x}": FAILS_WITH[x] for x in EFFECTS}}, facts["imap"]
    assert {str(k): v for k, v in facts["imap runs"].items()} == once
    # The error names the item that was running, not the chunk.
    assert facts["named imap"].endswith("(3)"), facts["named imap"]
    # imap_unordered: the same outcomes, in whatever order they came.
    outcomes = sorted(facts["imap_unordered"].values())
    assert outcomes == sorted(["ok"] * (24 - len(EFFECTS)) + list(FAILS_WITH.values()))
    assert {str(k): v for k, v in facts["imap_unordered runs"].items()} == once
    # map_async: fails (with the first failure to arrive), after every item ran once.
    assert facts["map_async"] in FAILS_WITH.values()
    assert {str(k): v for k, v in facts["map_async runs"].items()} == once


UNRECORDED = '''
import functools, tempfile
facts = {}
with pool.Pool(1, context=CTX) as p:
    # Item 1's value only cloudpickle can send: the record stops there. Items 1 to 3 ran,
    # 3 killed the worker; what 1 and 2 gave is unknown, and 4 and 5 may have run: every
    # item from 1 on fails, and none runs again.
    marks = tempfile.mkdtemp()
    run = functools.partial(tasks.counted_then, marks, {1: "local", 3: "sigkill"})
    got = []
    iterator = p.imap(run, range(6), chunksize=6)
    for _ in range(6):
        try:
            got.append(next(iterator))
        except pool.WorkerDied:
            got.append("died")
    facts["stopped"], facts["stopped runs"] = got, tasks.runs_of(marks)
    # The worker dies sending the reply, after its last item: every item is delivered.
    marks = tempfile.mkdtemp()
    run = functools.partial(tasks.counted_then, marks, {3: "dies-sending"})
    values = p.map(run, range(4), chunksize=4)
    facts["after the last"] = [getattr(v, "x", v) for v in values]
    facts["after the last runs"] = tasks.runs_of(marks)
# A death after close(): the rest of the chunk still runs, and join() waits for it.
p = pool.Pool(2, context=CTX)
marks = tempfile.mkdtemp()
result = p.map_async(functools.partial(tasks.counted_then, marks, {2: "sigkill"}), range(8),
                     chunksize=4)
p.close()
p.join()
try:
    result.get(0)
except pool.WorkerDied:
    facts["after close"] = "died"
facts["after close runs"] = tasks.runs_of(marks)
report(**facts)
'''


@pytest.mark.timeout(200)
@pytest.mark.parametrize("method", START_METHODS)
def test_items_whose_outcome_is_unknown_fail_and_never_run_twice(method, tmp_path):
    facts, _ = run_script(UNRECORDED, method, tmp_path, timeout=150)
    assert facts["stopped"] == [0, "died", "died", "died", "died", "died"]
    assert facts["stopped runs"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert facts["after the last"] == [0, 1, 4, 3]
    assert facts["after the last runs"] == {str(x): 1 for x in range(4)}
    assert facts["after close"] == "died"
    assert facts["after close runs"] == {str(x): 1 for x in range(8)}

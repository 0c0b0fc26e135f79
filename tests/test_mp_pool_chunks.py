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
with pool.Pool(2, context=CTX, task_timeout=0.5) as p:  # a chunk of n items: n x 0.5 s
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
    got = tasks.items_or_died(p.imap(run, range(6), chunksize=6), 6)
    facts["stopped"], facts["stopped runs"] = got, tasks.runs_of(marks)
    # The worker dies sending the reply, after its last item: every item is delivered.
    marks = tempfile.mkdtemp()
    run = functools.partial(tasks.counted_then, marks, {3: "dies-sending"})
    values = p.map(run, range(4), chunksize=4)
    facts["after the last"] = [getattr(v, "x", v) for v in values]
    facts["after the last runs"] = tasks.runs_of(marks)
    # A worker that exits with status 0 in the middle of a chunk: its record still counts.
    marks = tempfile.mkdtemp()
    iterator = p.imap(functools.partial(tasks.counted_then, marks, {1: "exit0"}), range(4),
                      chunksize=4)
    facts["exit 0"] = tasks.items_or_died(iterator, 4)
    facts["exit 0 runs"] = tasks.runs_of(marks)
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
    assert facts["exit 0"] == [0, "died", 4, 9]
    assert facts["exit 0 runs"] == {str(x): 1 for x in range(4)}
    assert facts["after close"] == "died"
    assert facts["after close runs"] == {str(x): 1 for x in range(8)}


TERMINATE_WHILE_THE_REST_RUNS = '''
import functools, tempfile, threading
marks = tempfile.mkdtemp()
facts = {}
def work(x):
    return tasks.sigkill_self() if x == 0 else tasks.start_then_sleep(marks, x)
seen = []
p = pool.Pool(1, context=CTX)
# Item 0 kills the worker; the rest of the chunk (1 to 3) runs again as a task, on a
# callback thread's say; terminate() comes while item 1 of it runs.
result = p.map_async(functools.partial(tasks.counted_then, marks,
                                       {0: "sigkill", 1: "sleep"}), range(4), chunksize=4,
                     error_callback=seen.append)
helpers.wait_until(lambda: os.path.exists(os.path.join(marks, "1")), 60)
p.terminate()
p.join()
result.wait(30)
facts["ready"] = result.ready()
try:
    result.get(0)
except BaseException as error:
    facts["error"] = type(error).__name__
facts["callback"] = [type(e).__name__ for e in seen]
report(**facts)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", START_METHODS)
def test_terminate_while_the_rest_of_a_chunk_runs_ends_at_once(method, tmp_path):
    """The review's hang: a chunk that recovers ends on a callback thread, and what it
    hands on must still run once terminate() has closed the callback threads."""
    for attempt in range(3):   # it hung in most runs before the fix
        facts, _ = run_script(TERMINATE_WHILE_THE_REST_RUNS, method, tmp_path, timeout=90)
        assert facts["ready"] and facts["callback"] == [facts["error"]], facts
        assert facts["error"] in ("WorkerDied", "WorkerTerminated", "CancelledError"), facts


NESTED = '''
import functools, tempfile
marks = tempfile.mkdtemp()
with pool.Pool(1, context=CTX) as p:
    iterator = p.imap(functools.partial(tasks.nested_pool_then, marks), range(4), chunksize=4)
    got = tasks.items_or_died(iterator, 4)
report(got=got, runs=tasks.runs_of(marks))
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", START_METHODS)
def test_a_pool_forked_inside_a_chunk_does_not_write_the_outer_chunks_record(method,
                                                                           tmp_path):
    """A worker forked from a worker inherits its record's file and map: it must record
    into its own, or the outer death would deliver the inner pool's values."""
    facts, _ = run_script(NESTED, method, tmp_path, timeout=90)
    assert facts["got"] == ["died", ["outer", 1], ["outer", 2], ["outer", 3]], facts
    assert facts["runs"] == {"0": 1, "1": 1, "2": 1, "3": 1}


SLOW_ITEMS = '''
import functools, tempfile
marks = tempfile.mkdtemp()
with pool.Pool(1, context=CTX, task_timeout=1.5) as p:
    values = p.map(functools.partial(tasks.counted_then, marks, {}), range(4), chunksize=4)
    sleepy = p.map(functools.partial(tasks.sleep_then, 0.6), range(4), chunksize=4)
report(values=values, sleepy=sleepy)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", START_METHODS)
def test_task_timeout_is_each_items_in_a_chunk(method, tmp_path):
    """Four items of 0.6 s, task_timeout=1.5: the chunk gets 4 x 1.5 s, and none of its
    items is blamed for the others' time."""
    facts, _ = run_script(SLOW_ITEMS, method, tmp_path, timeout=90)
    assert facts["values"] == [0, 1, 4, 9]
    assert facts["sleepy"] == [0, 1, 2, 3]

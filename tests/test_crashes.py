"""The table of faults: each kind of failure at each stage of a task's life.

One child interpreter per start method runs every row against one pool (with a hard
timeout); each row submits the faulty call between healthy ones, and the tests below check
that exactly the faulty future failed, with the right explanation, and that the pool and
its neighbours were unaffected.
"""

from __future__ import annotations

import sys

import pytest

from helpers import START_METHODS, process_exists, run_script

DEATHS = {"segfault": ("SIGSEGV", "Segmentation fault"), "abort": ("SIGABRT", "Aborted"),
          "sigkill": ("SIGKILL", None), "exit": (None, None)}

# (row id, how to make the faulty call) -- evaluated in the child interpreter.
ROWS = {
    **{f"receive-{e}": f"p.submit(tasks.take_argument, tasks.UnpickleBomb({e!r}, os.getpid()))"
       for e in [*DEATHS, "raise"]},
    # A large call is unpickled as it is read: the fault strikes with megabytes unread.
    **{f"receive-large-{e}": "p.submit(tasks.take_argument, (b'a' * (4 << 20), "
       f"tasks.UnpickleBomb({e!r}, os.getpid()), b'b' * (4 << 20)))"
       for e in [*DEATHS, "raise"]},
    **{f"run-{e}": f"p.submit(tasks.do_effect, {e!r})" for e in [*DEATHS, "raise"]},
    **{f"reply-{e}": f"p.submit(tasks.return_pickle_bomb, {e!r})"
       for e in [*DEATHS, "raise", "systemexit"]},
    "parent-receive-raise": "p.submit(tasks.return_unpickle_bomb_for_parent, 'raise')",
    "parent-receive-systemexit":
        "p.submit(tasks.return_unpickle_bomb_for_parent, 'systemexit')",
    "exception-needs-init-args": "p.submit(tasks.raise_needs_two_args)",
    "exception-without-dict": "p.submit(tasks.raise_without_dict)",
    "exception-unpicklable": "p.submit(tasks.raise_unpicklable)",
    "exception-fails-in-parent": "p.submit(tasks.raise_fails_in_parent)",
    "result-lambda": "p.submit(tasks.return_lambda)",
    "reply-then-die": "p.submit(tasks.reply_then_die, 'delivered')",
    "garbage-reply": "p.submit(tasks.write_garbage)",
    "corrupt-envelope": "p.submit(tasks.write_corrupt_raised_frame)",
    "partial-frame-then-hang": "p.submit(tasks.write_partial_then_hang, 'hung.pid')",
    "submit-unpicklable": "p.submit(tasks.identity, threading.Lock())",
}

SCENARIO = '''
rows = {rows!r}
results = {{}}
worker_pids = set()
with pool.ProcessPool(2, mp_context=CTX) as p:
    for row, make_call in rows.items():
        before = p.submit(tasks.square, 3)
        faulty = eval(make_call)
        after = [p.submit(tasks.square, i) for i in range(4)]
        outcome = {{"neighbours": [before.result(60)] + [f.result(60) for f in after]}}
        if row == "partial-frame-then-hang":
            # The others completed while half a frame sat in the pipe: nothing wedged.
            # Now end the silent worker from outside.
            helpers.wait_until(lambda: os.path.exists("hung.pid"), 30)
            os.kill(int(open("hung.pid").read()), signal.SIGKILL)
        error = faulty.exception(timeout=60)
        if error is None:
            value = faulty.result()
            outcome["result"] = value() if callable(value) else value
        else:
            outcome.update(type=type(error).__name__, text=str(error),
                           frames=[frame.name for frame in
                                   __import__("traceback").extract_tb(error.__traceback__)],
                           mro=[c.__name__ for c in type(error).__mro__],
                           notes=getattr(error, "__notes__", []))
            for attr in ("pid", "exitcode", "signal_name", "crash_report", "a", "b",
                         "type_name", "stage", "reason", "remote_traceback"):
                if hasattr(error, attr):
                    outcome[attr] = getattr(error, attr)
            outcome["context_suppressed"] = error.__suppress_context__
            cause = error.__cause__
            if cause is not None:
                outcome["cause"] = {{"type": type(cause).__name__, "text": str(cause)}}
                for attr in ("type_name", "reason", "remote_traceback"):
                    if hasattr(cause, attr):
                        outcome["cause"][attr] = getattr(cause, attr)
            if isinstance(error, pool.WorkerDied):
                worker_pids.add(error.pid)
                outcome["task_name"] = error.task.function_name
        results[row] = outcome
    worker_pids.update(p.map(tasks.pid_of_worker, range(20)))
report(results=results, worker_pids=sorted(worker_pids))
'''


# The first test of each start method runs the whole table in its setup.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Runs the whole table once per start method (in a child interpreter)."""
    cache = {}

    def get(method):
        if method not in cache:
            facts, _ = run_script(SCENARIO.format(rows=ROWS), method,
                                  tmp_path_factory.mktemp(method), timeout=240)
            cache[method] = facts
        return cache[method]
    return get


def _row(table, method, row):
    outcome = table(method)["results"][row]
    assert outcome.get("neighbours", [9, 0, 1, 4, 9]) == [9, 0, 1, 4, 9]
    return outcome


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("stage", ["receive", "receive-large", "run", "reply"])
@pytest.mark.parametrize("effect", list(DEATHS))
def test_a_death_fails_only_its_task_with_an_explanation(table, method, stage, effect):
    outcome = _row(table, method, f"{stage}-{effect}")
    signal_name, fatal_error = DEATHS[effect]
    assert outcome["type"] == "WorkerDied"
    assert "BrokenProcessPool" in outcome["mro"]
    assert outcome["signal_name"] == signal_name
    assert outcome["exitcode"] == (3 if effect == "exit" else -{"SIGSEGV": 11, "SIGABRT": 6,
                                                               "SIGKILL": 9}[signal_name])
    assert f"worker pid {outcome['pid']} died" in outcome["text"]
    task = {"receive": "take_argument", "receive-large": "take_argument", "run": "do_effect",
            "reply": "return_pickle_bomb"}[stage]
    assert outcome["task_name"] == f"tasks.{task}"
    assert f"tasks.{task}(" in outcome["text"]
    if fatal_error:  # the Python stack of the crash site, written while dying
        assert f"Fatal Python error: {fatal_error}" in outcome["crash_report"]
        site = {"receive": "_detonate_on_unpickle", "receive-large": "_detonate_on_unpickle",
                "run": "do_effect", "reply": "__reduce__"}[stage]
        assert f"in {site}" in outcome["crash_report"]
        assert outcome["crash_report"] in outcome["text"]
    elif effect == "sigkill":
        assert "killed from outside" in outcome["text"]
        assert outcome["crash_report"] is None
    else:
        assert "exit code 3" in outcome["text"]
    # As the stdlib's BrokenProcessPool from 3.15 on (gh-139462): a _RemoteTraceback cause
    # naming the process and its exit code (negative for a signal, as Process.exitcode).
    if sys.version_info >= (3, 15):
        assert outcome["cause"]["type"] == "_RemoteTraceback", outcome.get("cause")
        assert (f"Process {outcome['pid']} terminated abruptly with exit code "
                f"{outcome['exitcode']}") in outcome["cause"]["text"]
    else:
        assert "cause" not in outcome, outcome["cause"]
        # (No cause set at all: a None one would hide the caller's context.)
        assert outcome["context_suppressed"] is False


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("row", ["receive-raise", "receive-large-raise"])
def test_raise_while_unpickling_arguments_in_the_worker(table, method, row):
    # A BrokenProcessPool, as the stdlib raises there; the worker's error is the cause.
    outcome = _row(table, method, row)
    assert outcome["type"] == "ArgumentUnpicklingError" and "BrokenProcessPool" in outcome["mro"]
    assert "could not unpickle the task's function or arguments" in outcome["text"]
    assert outcome["cause"]["type"] == "ValueError" and outcome["cause"]["text"] == "effect"


@pytest.mark.parametrize("method", START_METHODS)
def test_raise_while_running(table, method):
    outcome = _row(table, method, "run-raise")
    assert outcome["type"] == "ValueError" and outcome["text"] == "effect"


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("effect, error", [("raise", "ValueError"), ("systemexit", "SystemExit")])
def test_result_that_fails_to_pickle_in_the_worker(table, method, effect, error):
    # The pickling error itself, as the stdlib raises it, with a note naming the value.
    outcome = _row(table, method, f"reply-{effect}")
    assert outcome["type"] == error
    assert any("pickling the task's return value, a PickleBomb" in n for n in outcome["notes"])


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("effect, error", [("raise", "ValueError"), ("systemexit", "SystemExit")])
def test_result_that_fails_to_unpickle_in_the_parent(table, method, effect, error):
    outcome = _row(table, method, f"parent-receive-{effect}")
    assert outcome["type"] == "ResultTransferError" and "BrokenProcessPool" in outcome["mro"]
    assert outcome["stage"] == "unpickling in the parent"
    assert f"{error}: effect" in outcome["reason"]
    assert outcome["cause"]["type"] == error


@pytest.mark.parametrize("method", START_METHODS)
def test_exception_whose_init_needs_arguments_comes_back_as_itself(table, method):
    outcome = _row(table, method, "exception-needs-init-args")
    assert outcome["type"] == "NeedsTwoArgs" and (outcome["a"], outcome["b"]) == (1, 2)


@pytest.mark.parametrize("method", START_METHODS)
def test_exception_without_a_dict_comes_back_as_itself_with_its_frames(table, method):
    # (tblib alone fails on it: the task failed with an AttributeError about __dict__.)
    outcome = _row(table, method, "exception-without-dict")
    assert outcome["type"] == "WithoutDict"
    assert outcome["text"] == "Cannot parse: 1:11: def broken(:"
    assert "raise_without_dict" in outcome["frames"]


@pytest.mark.parametrize("method", START_METHODS)
def test_exception_that_cannot_be_pickled_raises_the_pickling_error_with_it_as_text(table,
                                                                                  method):
    outcome = _row(table, method, "exception-unpicklable")
    assert outcome["type"] == "TypeError" and "pickle" in outcome["text"]  # as the stdlib
    cause = outcome["cause"]
    assert cause["type"] == "RemoteTaskError" and cause["type_name"] == "tasks.Unpicklable"
    assert "has a lock" in cause["text"]
    assert "in raise_unpicklable" in cause["remote_traceback"]
    assert "pickling in the worker failed" in cause["reason"]


@pytest.mark.parametrize("method", START_METHODS)
def test_exception_that_cannot_be_unpickled_in_the_parent_arrives_as_text(table, method):
    outcome = _row(table, method, "exception-fails-in-parent")
    assert outcome["type"] == "RemoteTaskError" and "BrokenProcessPool" in outcome["mro"]
    assert "only the worker can read me" in outcome["text"]
    assert "unpickling in the parent failed" in outcome["reason"]
    assert "in raise_fails_in_parent" in outcome["remote_traceback"]


@pytest.mark.parametrize("method", START_METHODS)
def test_lambda_results_travel_by_value(table, method):
    assert _row(table, method, "result-lambda")["result"] == 42


@pytest.mark.parametrize("method", START_METHODS)
def test_a_reply_sent_before_death_is_delivered(table, method):
    assert _row(table, method, "reply-then-die")["result"] == "delivered"


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("row", ["garbage-reply", "corrupt-envelope", "partial-frame-then-hang"])
def test_bytes_that_are_not_a_reply_fail_the_task_and_replace_the_worker(table, method, row):
    outcome = _row(table, method, row)
    if row != "partial-frame-then-hang":
        assert outcome["type"] == "WorkerProtocolError"
        assert "not a reply" in outcome["text"] and "tasks.write_" in outcome["text"]
    else:  # the half frame is dropped with the worker, which the scenario killed
        assert outcome["type"] == "WorkerDied" and outcome["signal_name"] == "SIGKILL"


@pytest.mark.parametrize("method", START_METHODS)
def test_unpicklable_argument_fails_its_future(table, method):
    outcome = _row(table, method, "submit-unpicklable")
    assert outcome["type"] == "ArgumentPicklingError" and "argument 0" in outcome["text"]


@pytest.mark.parametrize("method", START_METHODS)
def test_nothing_is_left_behind(table, method):
    facts = table(method)
    assert facts["children_left"] == [] and facts["threads_left"] == []
    assert not [pid for pid in facts["worker_pids"] if process_exists(pid)]


@pytest.mark.isolated
def test_a_builtin_that_kills_its_worker_is_named_in_the_crash_report(ctx):
    # ``os.abort`` itself as the task: the crash report holds only the pool's frames, which
    # the report leaves out. A line says the worker was in that call instead.
    import os

    import pool
    from pool._errors import IN_THE_TASK_FUNCTION
    with pool.ProcessPool(1, mp_context=ctx) as p:
        error = p.submit(os.abort).exception(60)
    assert isinstance(error, pool.WorkerDied) and error.signal_name == "SIGABRT"
    assert IN_THE_TASK_FUNCTION in error.crash_report.splitlines()
    assert ("\n  in posix.abort(), which is not Python code (a built-in or C function called "
            "directly as the task)") in str(error)

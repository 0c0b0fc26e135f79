"""Contract 6, "errors read like local ones", in the traceback's detail: a task's
exception, raised by ``future.result()``, prints its worker frames exactly as the same
exception raised in the caller would: the same lines, and the same carets under them
(Python 3.11+ underlines the failing expression, ``~~^~~`` under a binary operator)."""

from __future__ import annotations

import traceback
from typing import Any, Callable

import pytest

import pool
import traceback_tasks
from pool._wire import exceptions as _exceptions

TASKS = [traceback_tasks.divide, traceback_tasks.multi_line_call, traceback_tasks.call_chain,
         traceback_tasks.chained, traceback_tasks.in_a_method]


def raised_locally(fn: Callable[[Any], Any], arg: Any) -> BaseException:
    try:
        fn(arg)
    except Exception as exc:
        return exc
    raise AssertionError(f"{fn} did not raise")


def task_frames(exc: BaseException) -> list[list[str]]:
    """For each exception of the chain (cause or context first, as printed): the text of
    its frames in ``traceback_tasks`` (the source line and its carets), then its message."""
    printed = []
    te: traceback.TracebackException | None = traceback.TracebackException.from_exception(exc)
    while te is not None:
        frames = [te.stack.format_frame_summary(frame) for frame in te.stack
                  if frame.filename == traceback_tasks.__file__]
        printed.insert(0, frames + list(te.format_exception_only()))
        te = te.__cause__ or (None if te.__suppress_context__ else te.__context__)
    return printed


def carets(printed: list[list[str]]) -> int:
    return sum(line.strip(" ~^\n") == "" and "^" in line
               for frames in printed for frame in frames for line in frame.splitlines())


@pytest.mark.parametrize("fn", TASKS, ids=lambda fn: fn.__name__)
def test_a_remote_traceback_prints_as_a_local_one(ctx, fn):
    with pool.ProcessPool(1, mp_context=ctx) as p:
        remote = p.submit(fn, 0).exception(timeout=60)
    local = raised_locally(fn, 0)
    assert type(remote) is type(local)
    assert task_frames(remote) == task_frames(local)
    assert carets(task_frames(local)) > 0  # the comparison is about carets
    # And the lines each frame names, as ``tb_lineno`` (the first is the caller's).
    remote_tb = traceback.extract_tb(remote.__traceback__)
    local_tb = traceback.extract_tb(local.__traceback__)
    assert [(f.name, f.lineno) for f in remote_tb if f.filename == traceback_tasks.__file__] \
        == [(f.name, f.lineno) for f in local_tb if f.filename == traceback_tasks.__file__]


def test_the_frame_that_raises_it_in_the_caller_reads_as_the_stdlibs(ctx):
    # Above the worker's frames, the frame of ``result()`` shows ``raise self._exception``,
    # as the stdlib's ``Future.result`` does: no comment of the pool's after it.
    with pool.ProcessPool(1, mp_context=ctx) as p:
        future = p.submit(traceback_tasks.divide, 0)
        with pytest.raises(ZeroDivisionError) as info:
            future.result(timeout=60)
    pool_frames = [f for f in traceback.extract_tb(info.value.__traceback__)
                   if f.filename.startswith(str(pool.__path__[0]))]
    assert [(f.name, f.line) for f in pool_frames] == [("result", "raise self._exception")]


def test_a_frame_whose_columns_are_unknown_shows_no_carets():
    # ``-X no_debug_ranges`` in the worker, for example: the instruction has a line but
    # no columns. The rebuilt frame has none either, so no carets show, rather than
    # wrong ones.
    code = _exceptions._stub_code(11, None, None, None, None).replace(
        co_filename=traceback_tasks.__file__, co_name="divide", co_qualname="divide")
    try:
        exec(code, {})
    except NameError as exc:
        original = exc
    assert carets(task_frames(original)) == 0
    rebuilt = _exceptions.decode_exception(_exceptions.encode_exception(original))
    printed = task_frames(rebuilt)
    assert printed == task_frames(original) and printed[0][0].splitlines()[1:] == [
        "    return 1 / x"]
    assert carets(printed) == 0


def test_positions_travel_as_they_were():
    # Every frame keeps its line, its function's name and qualified name, and the
    # positions of the instruction it was at.
    exc = raised_locally(traceback_tasks.in_a_method, 0)
    rebuilt = _exceptions.decode_exception(_exceptions.encode_exception(exc))

    def facts(tb: Any) -> list[tuple[Any, ...]]:
        found = []
        while tb is not None:
            code = tb.tb_frame.f_code
            found.append((code.co_filename, code.co_name, code.co_qualname, tb.tb_lineno,
                          _exceptions._positions(code, tb.tb_lasti)))
            tb = tb.tb_next
        return found

    assert facts(rebuilt.__traceback__) == facts(exc.__traceback__)
    assert ("Holder.method" in [fact[2] for fact in facts(rebuilt.__traceback__)])


def test_positions_that_are_no_range_give_a_frame_without_carets_not_an_error():
    # A worker's bytes are not trusted: an end before the start must not cost the
    # exception its frames (compile() refuses such a tree).
    code = _exceptions._stub_code(5, 5, 5, 2, 1)
    assert [entry[2:] for entry in code.co_positions()
            if entry[0] == 5] and all(entry[2] is None for entry in code.co_positions()
                                      if entry[0] == 5)

"""Where starting workers cannot work: a main script without ``if __name__ == "__main__":``
and a daemonic process. Both fail in the stdlib too, but only deep inside a worker start,
with hundreds of lines of output; here they fail at once, in a few lines that name the fix.

Owns: nothing; pure checks. Runs in: a caller's thread (the constructor, the first submit).
Guarantees: never raises for a program that can start workers (a pool created at the top
level but used only under the guard passes, as it works with the stdlib); costs nothing
after a pool's first submission.
Assumes: multiprocessing's spawn and forkserver children re-run the main script's top
level as ``__mp_main__`` (with ``current_process()._inheriting`` set while they do), and a
forked child does not.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
from types import FrameType, ModuleType


def check_not_daemonic() -> None:
    """Raise if this process may not have children (multiprocessing forbids it to
    daemonic processes, such as a dask worker that its nanny started)."""
    if multiprocessing.current_process().daemon:
        raise RuntimeError(
            "pool.ProcessPool cannot start workers in this process: it is a daemonic "
            "multiprocessing process, and those may not have children. Create the pool in a "
            "process started with daemon=False (for a dask worker under a nanny: set "
            "distributed.worker.daemon to False, e.g. DASK_DISTRIBUTED__WORKER__DAEMON=False).")


def check_main_is_guarded(start_method: str) -> None:
    """Raise if workers started by ``start_method`` would run this very line again.

    Called when a pool is first used. With spawn or forkserver a worker imports the main
    script again; code at its top level outside the ``__main__`` guard runs again there,
    and if that code uses a pool, the worker would start workers of its own.
    """
    if start_method == "fork":
        return
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # We are such a worker (the parent could not see the mistake: no source).
        raise RuntimeError(_advice(start_method, "the main script", "(seen in a worker "
                                   "that was starting up)"))
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame = _top_level_frame(main)
    if main is None or path is None or frame is None:
        return  # not called from a main script's top level (-c, a REPL, a later call)
    line = frame.f_lineno
    try:
        with open(path, "rb") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, ValueError):
        return  # cannot tell: let it go as the stdlib would
    if not _guarded(tree.body, line):
        raise RuntimeError(_advice(start_method, path, f"(line {line})"))


def _top_level_frame(main: ModuleType | None) -> FrameType | None:
    """The frame running the main script's top level, if it is on this thread's stack."""
    if main is None:
        return None
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def _guarded(statements: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` lies inside an ``if __name__ == "__main__":`` body, at any depth."""
    for node in statements:
        end = getattr(node, "end_lineno", None) or node.lineno
        if not node.lineno <= line <= end:
            continue
        if isinstance(node, ast.If) and _is_main_test(node.test):
            return any(inner.lineno <= line <= (inner.end_lineno or inner.lineno)
                       for inner in node.body)
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and _guarded(
                    [n for child in inner for n in ([child] if isinstance(child, ast.stmt)
                                                    else getattr(child, "body", []))], line):
                return True
        return False
    return False


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    values = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(values) == 1


def _advice(start_method: str, script: str, where: str) -> str:
    return (
        f"a process pool is used at the top level of {script} {where}, outside "
        f"'if __name__ == \"__main__\":'. With the {start_method!r} start method every "
        f"worker imports the main script again, and would run that code too. Put the code "
        f"that uses the pool under 'if __name__ == \"__main__\":' (or pass "
        f"mp_context=multiprocessing.get_context(\"fork\")).")

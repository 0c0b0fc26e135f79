"""Where starting workers cannot work: a main script without ``if __name__ == "__main__":``
and a daemonic process. Both fail in the stdlib too, but only deep inside a worker start,
with hundreds of lines of output. Here they fail at once, in a few lines that name the fix.

Also keeps the main script importable by workers started after it returned (at exit).

Owns: the main script's path.
Runs in: a caller's thread (the constructor, the first submit); ``keep_main_importable``
in the dispatcher thread.
Guarantees: never raises for a program that can start workers. A pool created at the top
level but used only under the guard passes, as it works with the stdlib. So does any code
under a block that tests ``__name__``, and ``python -m package``, whose ``__main__``
module workers do not run again. Costs nothing after a pool's first submission, and parses
the main script once for all the pools it makes from the same line.
Assumes: multiprocessing's spawn and forkserver children re-run the main script's top
level as ``__mp_main__`` (with ``current_process()._inheriting`` set while they do), and a
forked child does not.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from types import FrameType, ModuleType

from .. import _compat


# The main script's path while it ran (see ``keep_main_importable``).
_main_path: str | None = None

# Whether a line of a main script lies under a ``__name__`` guard, by (path, modification
# time, size, line): see ``check_main_is_guarded``.
_verdicts: dict[tuple[str, int, int, int], bool] = {}


def remember_main_script() -> None:
    """Note the main script's path (a caller's thread, at a pool's first use)."""
    global _main_path
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(path, str):
        _main_path = path


def keep_main_importable() -> None:
    """Before starting a spawn or forkserver worker (the dispatcher thread): put back
    ``__main__.__file__`` if CPython removed it.

    CPython deletes it once the main script has returned, but the pool may still start
    workers after that: during the exit wait, which lets submitted work finish. Without the
    path, multiprocessing starts them without the main script, and a function of
    ``__main__`` that was pickled by reference cannot be found there. The script is over;
    nothing else reads the attribute.
    """
    main = sys.modules.get("__main__")
    if (_main_path is not None and main is not None and not hasattr(main, "__file__")
            and not sys.flags.interactive):  # python -i: the session goes on
        main.__file__ = _main_path


def check_not_daemonic() -> None:
    """Raises if this process may not have children: multiprocessing forbids them to
    daemonic processes, such as a dask worker that its nanny started."""
    if multiprocessing.current_process().daemon:
        raise RuntimeError(
            "pool.ProcessPool cannot start workers in this process: it is a daemonic "
            "multiprocessing process, and those may not have children. Create the pool in a "
            "process started with daemon=False (for a dask worker under a nanny: register "
            "pool.dask.ProcessPoolPlugin, which makes that safe, or set "
            "distributed.worker.daemon to False, e.g. DASK_DISTRIBUTED__WORKER__DAEMON=False).")


FORK_OPTION = 'pass mp_context=multiprocessing.get_context("fork")'


def check_main_is_guarded(start_method: str, fork_option: str = FORK_OPTION) -> None:
    """Raise if workers started by ``start_method`` would run this very line again.
    ``fork_option``: how the caller's API chooses fork, for the advice.

    Called when a pool is first used. With spawn or forkserver a worker imports the main
    script again; code at its top level outside the ``__main__`` guard runs again there,
    and if that code uses a pool, the worker would start workers of its own.
    """
    if start_method == "fork":
        return
    if _compat.starting_as_spawned_worker():
        # We are such a worker (the parent could not see the mistake: no source).
        raise RuntimeError(_advice(start_method, "the main script", "(seen in a worker "
                                   "that was starting up)", fork_option))
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__"):
        return  # ``python -m package``: workers do not run a __main__ module again
    frame = _top_level_frame(main)
    if main is None or path is None or frame is None:
        return  # not called from a main script's top level (-c, a REPL, a later call)
    line = frame.f_lineno
    try:
        stat = os.stat(path)
    except OSError:
        return  # cannot tell: let it go as the stdlib would
    # Parsing the script costs milliseconds (5 ms for 500 lines), at every pool's first
    # use: a script that makes pool after pool asks about the same line again and again.
    key = (path, stat.st_mtime_ns, stat.st_size, line)
    guarded = _verdicts.get(key)
    if guarded is None:
        try:
            with open(path, "rb") as source:
                guarded = _guarded(ast.parse(source.read(), path).body, line)
        except (OSError, SyntaxError, ValueError):
            guarded = True  # cannot tell: let it go as the stdlib would
        _verdicts[key] = guarded
    if not guarded:
        raise RuntimeError(_advice(start_method, path, f"(line {line})", fork_option))


def _top_level_frame(main: ModuleType | None) -> FrameType | None:
    """The frame running the main script's top level, if it is on this thread's stack."""
    if main is None:
        return None
    frame: FrameType | None = _compat.calling_frame()
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def _guarded(statements: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` lies, at any depth, inside a block that depends on ``__name__``:
    the ``__main__`` guard in whatever form, such as ``if __name__ == "__main__" and ...:``
    or ``match __name__:``. Anything that tests ``__name__`` counts: a check that cannot
    tell must let the program through."""
    for node in statements:
        end = getattr(node, "end_lineno", None) or node.lineno
        if not node.lineno <= line <= end:
            continue
        test = node.test if isinstance(node, (ast.If, ast.While)) else (
            node.subject if isinstance(node, ast.Match) else None)
        if test is not None and _mentions_name(test):
            return True
        inner: list[ast.stmt] = []
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, None) or []:
                inner += [child] if isinstance(child, ast.stmt) else getattr(child, "body", [])
        return _guarded(inner, line)
    return False


def _mentions_name(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(test))


def _advice(start_method: str, script: str, where: str, fork_option: str = FORK_OPTION
            ) -> str:
    return (
        f"a process pool is used at the top level of {script} {where}, outside "
        f"'if __name__ == \"__main__\":'. With the {start_method!r} start method every "
        f"worker imports the main script again, and would run that code too. Put the code "
        f"that uses the pool under 'if __name__ == \"__main__\":' (or {fork_option}).")

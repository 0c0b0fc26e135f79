"""map's ``MODULE:FUNCTION``: loading the function, and saying what is wrong with one that
cannot be loaded (a malformed spec, a missing or uncallable name, a module that raises
where it is imported, with the user's frames).

Runs in: the command's main thread, while the command line is parsed.
Guarantees: every way loading fails is an ``argparse.ArgumentTypeError`` whose message
says why; what the user's module prints while it is imported goes to standard error.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import sys
import traceback
from typing import Any, Callable, Iterator

from .console import flush_quietly, is_open

# What MODULE:FUNCTION may be, as a message about a malformed one says it.
FUNCTION_FORMS = ("module:function (math:factorial), module:obj.attr "
                  "(json:JSONDecoder.decode) or path/to/file.py:function (./script.py:f)")


def load_function(spec: str) -> Callable[..., Any]:
    """``MODULE:FUNCTION`` (importable) or ``PATH.py:FUNCTION`` (a script, by its path);
    FUNCTION may be dotted (``obj.attr``). Every way it can fail is an ArgumentTypeError
    that says why, and where the module raised if importing it did."""
    module_name, attribute = _split_spec(spec)
    try:
        with _stdout_to_stderr():   # standard output is for results only
            if _is_path(module_name):
                target: Any = _import_script(module_name)
            else:
                target = importlib.import_module(module_name)
        parts = attribute.split(".")
        for number, part in enumerate(parts):
            if not hasattr(target, part):
                owner = (f"module {module_name!r}" if number == 0
                         else f"{module_name}:{'.'.join(parts[:number])}")
                raise argparse.ArgumentTypeError(
                    f"cannot load {spec!r}: {owner} has no attribute {part!r}"
                    + _did_you_mean(part, target))
            target = getattr(target, part)
    except argparse.ArgumentTypeError:
        raise
    # The module's own code may raise anything while importing; a script that parses its
    # command line at import exits (SystemExit).
    except (Exception, SystemExit) as exc:
        why = (" (the module exits when it is imported: does it lack an "
               "'if __name__ == \"__main__\":'?)" if isinstance(exc, SystemExit) else "")
        raise argparse.ArgumentTypeError(
            f"cannot load {spec!r}: {type(exc).__name__}: {exc}{why}" + _where(exc)) from exc
    if not callable(target):
        raise argparse.ArgumentTypeError(
            f"{spec!r} is not callable: it is {_a(type(target).__name__)}")
    return target  # type: ignore[no-any-return]


def _is_path(module_name: str) -> bool:
    return module_name.endswith(".py") or os.sep in module_name


def _split_spec(spec: str) -> tuple[str, str]:
    """MODULE and FUNCTION. A path may hold ':' (it is split at the last); a module name
    cannot, so more than one there is a mistake (json:loads:x), not a module's name."""
    module_name, colon, attribute = spec.rpartition(":")
    problem = ("no ':'" if not colon
               else "more than one ':'" if ":" in module_name and not _is_path(module_name)
               else "nothing before ':'" if not module_name
               else "nothing after ':'" if not attribute else None)
    if problem is None:
        return module_name, attribute
    if not colon and "." in spec.strip(".") and not _is_path(spec):
        problem += f"; did you mean {':'.join(spec.rsplit('.', 1))!r}?"
    raise argparse.ArgumentTypeError(
        f"{spec!r} is not MODULE:FUNCTION ({problem}): give {FUNCTION_FORMS}")


def _did_you_mean(name: str, target: Any) -> str:
    """Close names that can be called (not the modules a module imported)."""
    try:
        names = [n for n in dir(target) if not n.startswith("_") or name.startswith("_")]
        close = [n for n in difflib.get_close_matches(name, names, n=6)
                 if callable(getattr(target, n, None))][:3]
    except Exception:   # a dir() or an attribute that raises: no suggestion
        return ""
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiouAEIOU" else f"a {noun}"


# Frames of a failed import that say nothing about the user's module: importlib's, ours,
# and the standard library's (argparse's, in a script that parses its arguments).
_NOT_THE_USERS = (importlib.__file__, __file__)
_STANDARD_LIBRARY = os.path.dirname(os.__file__) + os.sep
# At most this many of the user's frames, the last: where it raised, and what led there.
_WHERE_FRAMES = 5


def _where(exc: BaseException) -> str:
    """Where importing the user's module raised, under the message: its frames (file, line,
    code), without importlib's and ours, and for a SyntaxError the line it points at."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if frame.filename not in _NOT_THE_USERS
              and not frame.filename.startswith("<frozen importlib")
              and not (frame.filename.startswith(_STANDARD_LIBRARY)
                       and "-packages" + os.sep not in frame.filename)]
    lines = traceback.StackSummary.from_list(frames[-_WHERE_FRAMES:]).format()
    if isinstance(exc, SyntaxError):   # the file and line are the exception's, not a frame's
        lines += traceback.format_exception_only(type(exc), exc)[:-1]
    text = "".join(lines).rstrip("\n")
    return "\n" + text if text else ""


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While the user's module is imported: what it prints goes to standard error."""
    if not (is_open(1) and is_open(2)):
        yield
        return
    flush_quietly(sys.stdout)
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        flush_quietly(sys.stdout)
        os.dup2(saved, 1)
        os.close(saved)


def _import_script(path: str) -> Any:
    """Imports a script as the module its file name makes, from its directory, which goes
    first on ``sys.path``. Workers started by spawn or forkserver get that path too, so the
    function travels by reference: its globals and the file names in tracebacks stay."""
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"cannot load {path!r}: no such file")
    directory, filename = os.path.split(os.path.abspath(path))
    name = filename[:-3] if filename.endswith(".py") else filename
    if not name.isidentifier():
        raise argparse.ArgumentTypeError(
            f"cannot load {path!r}: {name!r} is not a valid module name; rename the file")
    sys.path.insert(0, directory)
    module = importlib.import_module(name)
    origin = getattr(module, "__file__", None)
    if origin is None or not os.path.samefile(origin, os.path.join(directory, filename)):
        raise argparse.ArgumentTypeError(
            f"cannot load {path!r}: the module {name!r} is {origin or 'built in'}, not this "
            f"file; rename the file")
    return module

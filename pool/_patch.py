"""``pool.patch()``: ``concurrent.futures.ProcessPoolExecutor`` becomes pool's class, and
``multiprocessing.Pool`` pool's ``Pool``, for code that looks the names up afterwards, such
as libraries that build their own pools (black, compileall, tqdm, dask; flake8, isort).
Also what ``python -m pool run`` shares with its start-up hook: the variable that names
the interpreter to patch.

Owns: the two names ``concurrent.futures.ProcessPoolExecutor`` and
``concurrent.futures.process.ProcessPoolExecutor``, and ``multiprocessing.pool.Pool``,
while patched, and what they held before.
Runs in: any thread of any process, under one lock. The start-up hook of ``python -m pool
run`` (``pool/_startup/sitecustomize.py``) patches the same way by itself: it must not
import pool before the class is looked up.
Guarantees: while any ``Patch`` is active, both executor names give
``_patched.ProcessPoolExecutor``, pool's executor with the stdlib's default start method;
``multiprocessing.pool.Pool`` is the hook's stand-in, which makes ``_patched``'s ``Pool``
(and so do ``multiprocessing.Pool`` and every context's ``.Pool``, which look it up there);
``ThreadPool`` is left alone. Once the last is undone, they give what they gave before,
unless something else has replaced them since: that stays. Patching imports nothing of
the executor: the class is imported at the first lookup, or the first pool made.
Assumes: ``concurrent.futures`` looks ``ProcessPoolExecutor`` up in ``.process`` on first
use and keeps it as a global, through its module ``__getattr__`` (3.7 to 3.14) or an
explicit lazy import (3.15, which has no ``__getattr__``: pool adds one while patched).
``.process`` has no ``__getattr__`` of its own on 3.11–3.14; one would be chained.
``multiprocessing``'s contexts import ``Pool`` from ``.pool`` at each call, and
``ThreadPool`` reaches the stdlib's ``Pool`` through that module's global (3.11–3.15).
"""
from __future__ import annotations

import sys
from types import ModuleType, TracebackType
from typing import Any

from ._locks import InterruptSafeLock

NAME = "ProcessPoolExecutor"
MP_POOL_NAME = "Pool"  # in multiprocessing.pool
PROCESS_MODULE = "concurrent.futures.process"
PACKAGE = "concurrent.futures"

# What ``python -m pool run`` sets for the programs it runs, and the start-up hook reads:
# the interpreter that should patch itself, as ``major.minor[abiflags]:sys.prefix``.
# Another Python that inherits the variable, of another version, build or environment,
# does nothing.
ENVIRONMENT_VARIABLE = "POOL_PATCH"

_lock = InterruptSafeLock()
_depth = 0              # active Patch handles (nested patch() calls undo in turn)
_saved: dict[str, Any] = {}
_MISSING = object()


class Patch:
    """What ``pool.patch()`` returns. ``undo()`` gives back what the two names held, once
    every other active ``Patch`` is undone too. As a context manager, leaving the block
    undoes it. Undoing twice does nothing the second time."""

    __slots__ = ("_active",)

    def __init__(self) -> None:
        self._active = True

    def undo(self) -> None:
        """Undoes this patch."""
        global _depth
        with _lock:
            if not self._active:
                return
            self._active = False
            _depth -= 1
            if _depth == 0:
                _restore()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"<pool.Patch {'active' if self._active else 'undone'}>"


def patch() -> Patch:
    """Makes ``concurrent.futures.ProcessPoolExecutor`` and
    ``concurrent.futures.process.ProcessPoolExecutor`` name pool's executor for every
    lookup from now on, in this process, until the returned ``Patch`` is undone.

    The class they name is a subclass of ``pool.ProcessPoolExecutor`` that keeps the
    stdlib's choice of start method when the caller gives no ``mp_context``:
    ``multiprocessing.get_context()``, which is ``fork`` on Linux before 3.14. So what the
    caller made for that context, such as a lock in ``initargs``, still works.

    It reaches code that looks the class up after the call: ``from concurrent.futures
    import ProcessPoolExecutor`` run later, inside a function or a module imported later;
    ``concurrent.futures.ProcessPoolExecutor(...)``; subclasses defined later. It cannot
    reach a name bound before: a module that imported the class already keeps the
    stdlib's. Nor can it reach other processes, which ``python -m pool run`` reaches, or
    other pools (loky, joblib).

    It also makes ``multiprocessing.Pool``, ``multiprocessing.pool.Pool`` and every
    context's ``.Pool(...)`` give :class:`pool.Pool`'s kind, a subclass of the stdlib's
    class, with the context the caller gave or the stdlib's default. ``ThreadPool`` and
    classes that subclass the stdlib's ``Pool`` stay the stdlib's.
    """
    import concurrent.futures.process as process_module
    import multiprocessing.pool as mp_pool_module
    return _patch(process_module, mp_pool_module)


def _patch(process_module: ModuleType, mp_pool_module: ModuleType) -> Patch:
    global _depth
    with _lock:
        if _depth == 0:
            _take_over(process_module)
            _take_over_mp_pool(mp_pool_module)
        _depth += 1
    return Patch()


def _take_over_mp_pool(module: ModuleType) -> None:
    """``multiprocessing.pool.Pool`` becomes a stand-in that makes pool's ``Pool``, the
    start-up hook's own (``mp_pool_stand_in``); the class is imported at the first pool
    made. Called under _lock."""
    from ._startup.sitecustomize import mp_pool_stand_in

    def real_class(stand_in: type) -> type:
        from ._patched import mp_pool_class
        return mp_pool_class(stand_in)

    original = module.__dict__.get(MP_POOL_NAME, _MISSING)
    _saved["mp_pool_module"] = module
    _saved["mp_pool"] = original
    if isinstance(original, type):
        stand_in = mp_pool_stand_in(original, real_class)
        module.__dict__[MP_POOL_NAME] = stand_in
        _saved["mp_pool_ours"] = stand_in


def _take_over(process_module: ModuleType) -> None:
    """Points both names at pool's class, resolved at their first lookup. Called under
    _lock."""
    package = sys.modules[PACKAGE]
    _saved.clear()
    _saved["module"] = process_module
    _saved["class"] = process_module.__dict__.get(NAME, _MISSING)
    _saved["package"] = package.__dict__.get(NAME, _MISSING)
    _saved["getattr"] = process_module.__dict__.get("__getattr__", _MISSING)
    previous = _saved["getattr"]

    def __getattr__(name: str) -> Any:
        # Only names the module does not hold come here: ProcessPoolExecutor, once.
        if name == NAME:
            from ._patched import ProcessPoolExecutor
            with _lock:
                still_patched = process_module.__dict__.get("__getattr__") is __getattr__
                if still_patched:
                    process_module.__dict__[NAME] = ProcessPoolExecutor  # found from now on
            if still_patched:
                return ProcessPoolExecutor
            # Undone while the class was being imported: what the name holds now. It is
            # looked up outside the lock: it may be another patch's __getattr__, which
            # takes the lock.
            return getattr(process_module, NAME)
        if previous is not _MISSING:
            return previous(name)
        raise AttributeError(f"module {PROCESS_MODULE!r} has no attribute {name!r}")

    process_module.__dict__.pop(NAME, None)
    process_module.__dict__["__getattr__"] = __getattr__
    # The package's global, if it was looked up already, is looked up again: through
    # the package's own __getattr__, from .process, so from the function above.
    package.__dict__.pop(NAME, None)
    _saved["ours"] = __getattr__
    # 3.15's package binds the name with an explicit lazy import (PEP 810) and has no
    # __getattr__ of its own: one that asks .process stands in for it while patched.
    _saved["package_getattr"] = package.__dict__.get("__getattr__", _MISSING)
    if _saved["package_getattr"] is _MISSING:
        def package_getattr(name: str) -> Any:
            if name == NAME:
                return getattr(process_module, NAME)
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")

        package.__dict__["__getattr__"] = package_getattr
        _saved["package_ours"] = package_getattr


def _restore() -> None:
    """Gives both names back what they held before the first patch. Called under _lock."""
    process_module = _saved["module"]
    package = sys.modules[PACKAGE]
    if process_module.__dict__.get("__getattr__") is _saved["ours"]:
        if _saved["getattr"] is _MISSING:
            del process_module.__dict__["__getattr__"]
        else:
            process_module.__dict__["__getattr__"] = _saved["getattr"]
    if _saved.get("package_ours") is not None and \
            package.__dict__.get("__getattr__") is _saved["package_ours"]:
        del package.__dict__["__getattr__"]
    # Not imported if no lookup ever needed it; then no name holds it.
    patched = sys.modules.get(f"{__package__}._patched")
    ours = getattr(patched, NAME, None)
    for module, key in ((process_module, "class"), (package, "package")):
        if module.__dict__.get(NAME, ours) is not ours:
            continue   # someone else's since: theirs to keep
        if _saved[key] is _MISSING:
            module.__dict__.pop(NAME, None)
        else:
            module.__dict__[NAME] = _saved[key]
    mp_pool_module = _saved.get("mp_pool_module")
    stand_in = _saved.get("mp_pool_ours")
    if stand_in is not None and mp_pool_module.__dict__.get(MP_POOL_NAME) is stand_in:
        mp_pool_module.__dict__[MP_POOL_NAME] = _saved["mp_pool"]
    _saved.clear()


def interpreter_key() -> str:
    """This interpreter, as ``ENVIRONMENT_VARIABLE`` names the one to patch. The start-up
    hook (``pool/_startup/sitecustomize.py``) builds the same key itself."""
    return (f"{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}:"
            f"{sys.prefix}")

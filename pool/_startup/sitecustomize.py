"""The start-up hook of ``python -m pool run``: every Python process that inherits its
``PYTHONPATH`` imports this module as ``sitecustomize`` while it starts (``site`` does).

Runs in: any Python process that inherits the environment, in its main thread, before the
program's own code. That may be another interpreter, so it uses only what every Python 3
has. It imports nothing of pool: a program may have a module of its own named ``pool``.
Guarantees: in the interpreter ``POOL_PATCH`` names, and only there,
``concurrent.futures.process.ProcessPoolExecutor`` gives ``pool._patched.ProcessPoolExecutor``
once the module is imported, and so does ``concurrent.futures``'s; and
``multiprocessing.pool.Pool`` is a stand-in that makes ``pool._patched``'s ``Pool`` (so do
``multiprocessing.Pool`` and every context's ``.Pool``); ``ThreadPool`` stays the stdlib's.
pool is imported at the first lookup of the name, or the first pool made, not before.
Every process then goes on as if this module were not there. Its directory leaves
``sys.path``. The ``sitecustomize`` it shadows, a
distribution's or a virtual environment's, is imported in its place, with its errors
reported as ``site`` reports them. It never keeps a program from starting.
Assumes: ``pool/_patch.py`` names this interpreter the same way (``interpreter_key``); the
tests compare the two.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_POOL_PACKAGE = os.path.dirname(_HERE)
_PROCESS_MODULE = "concurrent.futures.process"
_NAME = "ProcessPoolExecutor"
_MP_POOL_MODULE = "multiprocessing.pool"
_MP_POOL_NAME = "Pool"


def _start():  # type: () -> None
    sys.path[:] = [entry for entry in sys.path
                   if not entry or os.path.abspath(entry) != _HERE]
    key = "%d.%d%s:%s" % (sys.version_info[0], sys.version_info[1],
                          getattr(sys, "abiflags", ""), sys.prefix)
    wanted = os.environ.get("POOL_PATCH")
    # The program itself, which has the pid pool run had (exec keeps it), says if it is
    # not on the interpreter pool run patches. The processes it starts say nothing.
    if os.environ.get("POOL_RUN_PID") == str(os.getpid()):
        del os.environ["POOL_RUN_PID"]
        if wanted and wanted != key:
            _say("pool: this program runs on %s (Python %s), not on the Python that ran "
                 "python -m pool run (%s): its process pools are not pool's"
                 % (sys.executable, key, wanted))
    if wanted == key:
        for name, take_over in ((_PROCESS_MODULE, _take_over),
                                (_MP_POOL_MODULE, _take_over_mp_pool)):
            if name in sys.modules:   # a .pth file imported it
                take_over(sys.modules[name])
            else:
                finder = _PatchWhenImported(name, take_over)  # type: ignore[no-untyped-call]
                sys.meta_path.insert(0, finder)
    _import_the_shadowed_sitecustomize()


def _take_over(module):  # type: (object) -> None
    """The module's ProcessPoolExecutor becomes pool's, looked up on first use."""
    namespace = module.__dict__
    original = namespace.pop(_NAME, None)

    def __getattr__(name):  # type: (str) -> object
        if name != _NAME:
            raise AttributeError("module %r has no attribute %r" % (_PROCESS_MODULE, name))
        found = _pool_class(original)
        if namespace.get("__getattr__") is __getattr__:   # unless undone meanwhile
            namespace[_NAME] = found   # later lookups do not come here
        return found

    namespace["__getattr__"] = __getattr__


def _take_over_mp_pool(module):  # type: (object) -> None
    """The module's Pool becomes a stand-in that builds pool's, looked up on first use."""
    original = module.__dict__.get(_MP_POOL_NAME)
    if isinstance(original, type):
        module.__dict__[_MP_POOL_NAME] = mp_pool_stand_in(original, _pool_mp_class)


def mp_pool_stand_in(original, real_class):  # type: (type, object) -> type
    """A subclass of the stdlib's ``multiprocessing.pool.Pool`` to put in its place. Made
    as itself (``multiprocessing.Pool(...)``, ``multiprocessing.pool.Pool(...)``, every
    context's ``.Pool(...)``), it makes ``real_class(stand_in)``'s object instead: pool's,
    a subclass of this one, so ``isinstance`` checks still hold. Everything else stays the
    stdlib's: ``ThreadPool``, which calls ``Pool.__init__`` and the stdlib's static
    helpers through the module's name ``Pool``, and classes that subclass it."""
    class StandInType(type(original)):  # type: ignore[misc]
        # isinstance and issubclass against the stand-in answer for the stdlib's class:
        # a ThreadPool, or a pool made before the patch, is still a multiprocessing Pool.
        def __instancecheck__(cls, obj):  # type: ignore[no-untyped-def]
            if cls is Pool:
                return isinstance(obj, original)
            return super().__instancecheck__(obj)

        def __subclasscheck__(cls, sub):  # type: ignore[no-untyped-def]
            if cls is Pool:
                return issubclass(sub, original)
            return super().__subclasscheck__(sub)

    class Pool(original, metaclass=StandInType):  # type: ignore[misc]
        __doc__ = original.__doc__

        def __new__(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
            if cls is Pool:
                real = real_class(Pool)  # type: ignore[operator]
                if real is not None:
                    return object.__new__(real)  # type.__call__ then runs its __init__
            return object.__new__(cls)

    Pool.__module__ = original.__module__
    Pool.__qualname__ = original.__qualname__
    return Pool


def _pool_mp_class(stand_in):  # type: (type) -> object
    """pool's ``multiprocessing.Pool`` face as the stand-in's subclass; None (the stdlib's
    pool then) where pool cannot be imported, with a word on why."""
    try:
        if not _import_this_pool():
            _say("pool: this program has a module of its own named pool, so its process "
                 "pools stay the stdlib's (python -m pool run cannot import pool's)")
            return None
        from pool._patched import mp_pool_class
        return mp_pool_class(stand_in)
    except Exception as exc:   # never keep the program from running
        _say("pool: python -m pool run cannot patch this process (%s: %s)"
             % (type(exc).__name__, exc))
        return None


def _pool_class(original):  # type: (object) -> object
    """pool's class, from the pool this hook belongs to. Else the stdlib's, with a word on
    why."""
    try:
        if not _import_this_pool():
            _say("pool: this program has a module of its own named pool, so its process "
                 "pools stay the stdlib's (python -m pool run cannot import pool's)")
            return original
        from pool._patched import ProcessPoolExecutor
        return ProcessPoolExecutor
    except Exception as exc:   # never keep the program from running
        _say("pool: python -m pool run cannot patch this process (%s: %s)"
             % (type(exc).__name__, exc))
        return original


def _import_this_pool():  # type: () -> bool
    """Imports the pool this hook belongs to, as ``pool``; False if ``pool`` is, or would
    be, a module of the program's own (which then stays the program's)."""
    loaded = sys.modules.get("pool")
    if loaded is not None:
        return _is_this_pool(getattr(loaded, "__file__", None))
    import importlib.util
    spec = importlib.util.find_spec("pool")
    if spec is not None:
        if not _is_this_pool(spec.origin):
            return False
        __import__("pool")
        return True
    # Not importable from the program's path, as when pool runs from a source tree: import
    # it from where this hook is, without changing the path.
    spec = importlib.util.spec_from_file_location(
        "pool", os.path.join(_POOL_PACKAGE, "__init__.py"),
        submodule_search_locations=[_POOL_PACKAGE])
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules["pool"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["pool"]
        raise
    return True


def _is_this_pool(path):  # type: (object) -> bool
    return (isinstance(path, str)
            and os.path.realpath(os.path.dirname(path)) == os.path.realpath(_POOL_PACKAGE))


class _PatchWhenImported(object):
    """A meta path finder that finds nothing itself. It has the finders after it find its
    module (``concurrent.futures.process``, ``multiprocessing.pool``), and patches the
    module once its code has run. Then it leaves the import system: ``sys.meta_path`` is
    rebound, not changed in place, since another thread may be going through it."""

    def __init__(self, module_name, take_over):  # type: ignore[no-untyped-def]
        self._module_name = module_name
        self.take_over = take_over

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != self._module_name:
            return None
        finders = list(sys.meta_path)
        if self not in finders:
            return None
        for finder in finders[finders.index(self) + 1:]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            then_patch = _LoaderThenPatch(spec.loader, self)  # type: ignore[no-untyped-call]
            spec.loader = then_patch
        return spec


class _LoaderThenPatch(object):
    """The module's own loader, then the patch; the module keeps its own loader."""

    def __init__(self, loader, finder):  # type: ignore[no-untyped-def]
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        create = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        sys.meta_path = [finder for finder in sys.meta_path if finder is not self._finder]
        self._finder.take_over(module)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._loader, name)


def _import_the_shadowed_sitecustomize():  # type: () -> None
    this = sys.modules.pop("sitecustomize", None)
    try:
        __import__("sitecustomize")   # the one this module shadows, if any
    except ImportError as exc:
        # The import that runs this module takes sys.modules["sitecustomize"] as its
        # result when this module ends: it must hold a module.
        if this is not None:
            sys.modules["sitecustomize"] = this
        if getattr(exc, "name", "sitecustomize") != "sitecustomize":  # no name: 2.7
            raise


def _say(text):  # type: (str) -> None
    try:
        if sys.stderr is not None:   # None: started with standard error closed
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
    except Exception:
        pass


if __name__ == "sitecustomize":   # not when a tool imports pool._startup.sitecustomize
    _start()

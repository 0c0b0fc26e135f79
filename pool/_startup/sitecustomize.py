"""The start-up hook of ``python -m pool run``: every Python process that inherits its
``PYTHONPATH`` imports this module as ``sitecustomize`` while it starts (``site`` does).

Runs in: any Python process that inherits the environment, in its main thread, before the
program's own code; possibly another interpreter, so it uses only what every Python 3 has.
Guarantees: the interpreter ``POOL_PATCH`` names, and only that one, patches
``concurrent.futures`` (pool's ``_patch.patch_at_startup``; ``_patch.interpreter_key`` is
the same key, which the tests check); every process then goes on as if this module were not there:
its directory leaves ``sys.path``, and the ``sitecustomize`` it shadows (a distribution's
or a virtual environment's) is imported in its place, with its errors reported as ``site``
reports them.
"""

import os
import sys


def _start():  # type: () -> None
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path
                   if not entry or os.path.abspath(entry) != here]
    key = "%d.%d:%s" % (sys.version_info[0], sys.version_info[1], sys.prefix)
    wanted = os.environ.get("POOL_PATCH")
    # The program itself (the pid pool run had, kept across exec) says if it is not the
    # interpreter pool run patches; the processes it starts say nothing.
    if os.environ.get("POOL_RUN_PID") == str(os.getpid()):
        del os.environ["POOL_RUN_PID"]
        if wanted and wanted != key:
            sys.stderr.write(
                "pool: this program runs on %s (Python %s), not on the Python that ran "
                "python -m pool run (%s): its process pools are not pool's\n"
                % (sys.executable, key, wanted))
    if wanted == key:
        try:
            from pool._patch import patch_at_startup
            patch_at_startup()
        except Exception as exc:   # (never keep the program from starting)
            sys.stderr.write("pool: python -m pool run cannot patch this process (%s: %s)\n"
                             % (type(exc).__name__, exc))
    this = sys.modules.pop("sitecustomize")
    try:
        __import__("sitecustomize")   # (the one this module shadows, if any)
    except ImportError as exc:
        # (The import that runs this module takes sys.modules["sitecustomize"] as its
        # result when this module ends: it must hold a module.)
        sys.modules["sitecustomize"] = this
        if getattr(exc, "name", "sitecustomize") != "sitecustomize":  # (no name: 2.7)
            raise


_start()

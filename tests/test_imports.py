"""The import graph of pool, read from its source, and the rules it keeps (DESIGN.md,
"Style": imports form a tree; the core imports no I/O module; only the command line
imports the command line; every private name of the stdlib is used in ``pool._compat``).

Every module under ``pool/`` is parsed with ``ast``; every import is collected, wherever
it is: at the top, or inside a function (a lazy import is a dependency too, once it runs),
relative or absolute, ``from . import x`` where ``x`` is a submodule, and
``importlib.import_module`` (or ``__import__``) called with a literal name.

Left out, on purpose:
- imports under ``if TYPE_CHECKING:``: they never run, so they cannot form a cycle;
- the implicit import of a module's parent packages: every package ``__init__`` imports no
  pool module at its top level (a rule below), so those edges would bring nothing;
- a name computed at run time (``import_module(name)``): no test can read it.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pool

ROOT = Path(pool.__file__).resolve().parent  # the source of the pool these tests import


@dataclass(frozen=True)
class Import:
    """One import statement's (or call's) dependency of ``module`` on ``target``."""
    module: str
    target: str          # the module imported, absolute
    line: int
    lazy: bool           # inside a function: runs when it is called

    def __str__(self) -> str:
        where = "in a function" if self.lazy else "at the top"
        return f"{self.module} imports {self.target} (line {self.line}, {where})"


# -- reading the source ---------------------------------------------------------------------

def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by its dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = module_files()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _is_module(name: str, known: Iterable[str]) -> bool:
    """Whether ``name`` is a module (not an attribute of one): pool's by its file, the
    stdlib's by its spec. Another library is not imported to find out: its names count as
    attributes of the module they come from."""
    if name == "pool" or name.startswith("pool."):
        return name in known
    if name.split(".")[0] not in sys.stdlib_module_names:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: Iterable[str]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = set(known)
        self.depth = 0  # functions we are inside of
        self.found: list[Import] = []

    def _add(self, target: str, node: ast.AST) -> None:
        self.found.append(Import(self.module, target, getattr(node, "lineno", 0),
                                 self.depth > 0))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for statement in node.orelse:
                self.visit(statement)  # only the else branch runs
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                               self.package)
        else:
            base = node.module or ""
        if base == "__future__":
            return
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if alias.name != "*" and _is_module(submodule, self.known):
                self._add(submodule, node)
            else:
                self._add(base, node)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else (
            function.id if isinstance(function, ast.Name) else None)
        if name in ("import_module", "__import__") and node.args:
            target = _literal(node.args[0])
            if target is not None:
                if target.startswith("."):
                    anchor = node.args[1] if len(node.args) > 1 else None
                    package = _literal(anchor) or (
                        self.module if isinstance(anchor, ast.Name) and anchor.id == "__name__"
                        else self.package)
                    target = importlib.util.resolve_name(target, package)
                self._add(target, node)
        self.generic_visit(node)


def imports_in(source: str, module: str, *, is_package: bool = False,
               known: Iterable[str] = MODULES) -> list[Import]:
    """Every import in ``source``, the text of ``module``."""
    collector = _ImportCollector(module, is_package, known)
    collector.visit(ast.parse(source))
    return list(dict.fromkeys(collector.found))  # one per statement and module imported


def _read_all() -> dict[str, list[Import]]:
    return {name: imports_in(path.read_text(), name, is_package=name in PACKAGES)
            for name, path in MODULES.items()}


IMPORTS = _read_all()
GRAPH = {name: {i.target: i for i in found if i.target in MODULES}
         for name, found in IMPORTS.items()}  # pool's modules only: one edge per pair


def _describe(path: list[str]) -> str:
    return "\n  ".join(str(GRAPH[a][b]) for a, b in zip(path, path[1:]))


def find_cycle(graph: dict[str, dict[str, Import]]) -> list[str] | None:
    """One cycle of the graph as a path (its first module repeated at its end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def reached_from(start: str) -> dict[str, list[str]]:
    """Every pool module that importing ``start`` can import, each with a path to it."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop()
        for target in sorted(GRAPH[node]):
            if target not in paths:
                paths[target] = paths[node] + [target]
                todo.append(target)
    return paths


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# -- the parser finds what is there -------------------------------------------------------

SAMPLE = '''
import os.path
import pool._errors as errors
from typing import TYPE_CHECKING
from . import sibling, _helper
from .. import _exit, __version__
from ..wire.frames import Kind
if TYPE_CHECKING:
    from pool import _never
else:
    import json
def later():
    from .._shared import shared
    import importlib
    importlib.import_module("pool._literal")
    importlib.import_module("._relative", __package__)
    __import__("zlib")
'''


def test_the_parser_finds_every_form_of_import():
    known = {"pool", "pool._errors", "pool._exit", "pool.pkg", "pool.pkg.sibling",
             "pool.pkg.mod", "pool._shared"}
    found = {(i.target, i.lazy) for i in imports_in(SAMPLE, "pool.pkg.mod", known=known)}
    assert found == {
        ("os.path", False), ("pool._errors", False), ("typing", False),
        ("pool.pkg.sibling", False), ("pool.pkg", False),   # _helper: not a module
        ("pool._exit", False), ("pool", False),              # __version__: an attribute
        ("pool.wire.frames", False), ("json", False),
        ("pool._shared", True), ("importlib", True), ("pool._literal", True),
        ("pool.pkg._relative", True), ("zlib", True),
    }, found


def test_the_graph_has_the_edges_known_to_be_there():
    # Guards against a reader that silently finds nothing: each form, in pool's own source.
    known = [
        ("pool.__main__", "pool._cli.main", False),            # from ._cli.main import main
        ("pool._executor", "pool._futures", False),            # from ._futures import ...
        ("pool._executor", "pool._dispatcher.front", True),    # in __init__
        ("pool._worker.main", "pool._exit", False),            # from .. import _exit
        ("pool._worker.main", "pool._wire.pickling", False),   # from .._wire import a, b
        ("pool._wire.pickling", "pool._errors", True),         # lazily, two levels up
        ("pool._worker.handle", "pool._worker.teardown", False),   # from . import teardown
    ]
    for module, target, lazy in known:
        edge = GRAPH[module].get(target)
        assert edge is not None, f"{module} -> {target} not found"
        assert any(i.target == target and i.lazy == lazy for i in IMPORTS[module]), edge
    assert len(MODULES) > 40 and sum(map(len, GRAPH.values())) > 100


def test_find_cycle_reports_the_path():
    def edge(a: str, b: str) -> Import:
        return Import(a, b, 1, False)
    graph = {"a": {"b": edge("a", "b")}, "b": {"c": edge("b", "c")},
             "c": {"a": edge("c", "a")}, "d": {"a": edge("d", "a")}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    del graph["c"]["a"]
    assert find_cycle(graph) is None


# -- the rules ------------------------------------------------------------------------------

def test_imports_form_no_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, f"an import cycle, lazy imports included:\n  {_describe(cycle)}"


def test_no_package_init_imports_a_pool_module_at_its_top():
    # Importing any module runs its packages' __init__ first: what they import at their
    # top, every module would import. (So the graph may leave those edges out.)
    for package in sorted(PACKAGES):
        eager = [i for i in IMPORTS[package] if not i.lazy and _within(i.target, ["pool"])]
        assert not eager, f"{package} is a package; it must import nothing of pool's: " + (
            "; ".join(map(str, eager)))


# What the core must not import: threads, processes and I/O (the rule), and the same
# things under other names (``_thread`` is threading's engine, ``selectors`` select's,
# ``asyncio`` and ``concurrent`` run threads and processes).
CORE_FORBIDDEN = {"threading", "multiprocessing", "os", "socket", "select", "subprocess",
                  "_thread", "selectors", "asyncio", "concurrent"}


def test_the_core_imports_only_the_core_and_pure_stdlib():
    core = [name for name in MODULES if _within(name, ["pool._core"])]
    assert "pool._core.machine" in core
    for module in core:
        for found in IMPORTS[module]:
            target = found.target
            if _within(target, ["pool"]):
                assert _within(target, ["pool._core"]), (
                    f"the core imports only itself and the stdlib: {found}")
                continue
            top = target.split(".")[0]
            assert top in sys.stdlib_module_names, f"the core imports only the stdlib: {found}"
            assert top not in CORE_FORBIDDEN, (
                f"the core does no I/O and starts no thread or process: {found}")


def test_only_the_command_line_imports_the_command_line():
    for module, found in IMPORTS.items():
        if _within(module, ["pool._cli"]) or module == "pool.__main__":
            continue
        wrong = [i for i in found if _within(i.target, ["pool._cli"])]
        assert not wrong, "only pool._cli and pool.__main__ import pool._cli: " + (
            "; ".join(map(str, wrong)))


# What a worker process may import of pool's: its own side, the wire, the errors it sends,
# the process's life, the stdlib's private names, what the platform offers, the shake's
# delay points, and the lock that guards the wire's segment cache.
WORKER_SIDE = ("pool._worker", "pool._wire", "pool._errors", "pool._exit", "pool._compat",
               "pool._platform", "pool._shake", "pool._locks")


def test_a_worker_imports_only_the_worker_side():
    paths = reached_from("pool._worker.main")
    assert "pool._wire.pickling" in paths and "pool._errors" in paths
    for module, path in sorted(paths.items()):
        assert _within(module, WORKER_SIDE), (
            f"pool._worker.main reaches {module}, which is not the worker's side:\n  "
            f"{_describe(path)}")


# -- private names of the stdlib ------------------------------------------------------------

# Private names that are the stdlib's documented interface: allowed anywhere.
PRIVATE_ALLOWED = {
    "os._exit",   # documented: the exit of a forked child, without the parent's cleanup
}

# Private attributes of stdlib objects (not modules) that pool knows it uses: outside
# ``_compat``, they may not appear at all, on whatever object, as an attribute or a
# ``getattr`` string. (An attribute of an object is not seen by the module rules below.)
KNOWN_PRIVATE_ATTRIBUTES = {"_forkserver_pid", "_forkserver_alive_fd", "_preload_modules",
                            "_popen", "_flush_std_streams", "_register_atexit", "_getframe",
                            "_run_exitfuncs", "_STATE_TO_DESCRIPTION_MAP"}

# Exempt by design: ``PoolFuture`` (``pool/_futures.py``) is a ``Future`` that keeps its
# state where ``Future`` keeps it (``self._state``, ``self._waiters``, ...), because the
# stdlib's ``wait`` and ``as_completed`` read it there; the class's docstring says so and
# tests pin it. Attributes reached through ``self`` are not checked.


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_stdlib(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names and top != "pool"


class _PrivateNameFinder(ast.NodeVisitor):
    def __init__(self, imports: list[Import], source: ast.AST) -> None:
        self.found: list[tuple[int, str]] = []
        self.modules: dict[str, str] = {}  # local name -> stdlib module it is bound to
        for node in ast.walk(source):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.modules[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.modules[top] = top
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _is_module(full, ()):
                        self.modules[alias.asname or alias.name] = full
        self.modules = {k: v for k, v in self.modules.items() if _is_stdlib(v)}
        for found in imports:
            parts = found.target.split(".")
            if _is_stdlib(found.target) and any(_private(p) for p in parts):
                self.found.append((found.line, f"imports the private module {found.target}"))

    def _dotted(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def _report(self, node: ast.AST, name: str) -> None:
        if name not in PRIVATE_ALLOWED:
            self.found.append((getattr(node, "lineno", 0), f"reaches {name}"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.level and node.module and _is_stdlib(node.module):
            for alias in node.names:
                if _private(alias.name):
                    self._report(node, f"{node.module}.{alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            base = self._dotted(node.value)
            if base is not None:
                self._report(node, f"{base}.{node.attr}")
            elif node.attr in KNOWN_PRIVATE_ATTRIBUTES:
                self._report(node, f"the stdlib's private attribute {node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        if (isinstance(function, ast.Name)
                and function.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) >= 2):
            name = _literal(node.args[1])
            if name is not None and _private(name):
                base = self._dotted(node.args[0])
                if base is not None:
                    self._report(node, f"{base}.{name}")
                elif name in KNOWN_PRIVATE_ATTRIBUTES:
                    self._report(node, f"the stdlib's private attribute {name}")
        self.generic_visit(node)


def private_names_in(source: str, module: str, known: Iterable[str] = MODULES
                     ) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    finder = _PrivateNameFinder(imports_in(source, module, known=known), tree)
    finder.visit(tree)
    return sorted(finder.found)


PRIVATE_SAMPLE = '''
import os, sys
import multiprocessing.util
import concurrent.futures._base as base
from _thread import RLock
from multiprocessing import forkserver
from concurrent.futures import _base
def f(process, server):
    os._exit(0)
    sys._getframe()
    multiprocessing.util._flush_std_streams()
    getattr(forkserver, "_forkserver", None)
    getattr(server, "_forkserver_pid", None)
    process._popen.close()
    self._state, os.__file__, process._own
'''


def test_the_private_name_finder_finds_every_form():
    found = [what for _, what in private_names_in(PRIVATE_SAMPLE, "pool.sample")]
    assert found == [
        "imports the private module concurrent.futures._base",
        "imports the private module _thread",
        "imports the private module concurrent.futures._base",
        "reaches concurrent.futures._base",
        "reaches sys._getframe",
        "reaches multiprocessing.util._flush_std_streams",
        "reaches multiprocessing.forkserver._forkserver",
        "reaches the stdlib's private attribute _forkserver_pid",
        "reaches the stdlib's private attribute _popen",
    ], found
    # And in pool's own source: _compat is where they are.
    compat = private_names_in(MODULES["pool._compat"].read_text(), "pool._compat")
    assert len(compat) >= 8, compat


def test_only_compat_reaches_private_names_of_the_stdlib():
    wrong = []
    for module, path in MODULES.items():
        if module == "pool._compat":
            continue
        for line, what in private_names_in(path.read_text(), module):
            wrong.append(f"{module} (line {line}) {what}")
    assert not wrong, ("a private name of the stdlib is used only through pool._compat:\n  "
                       + "\n  ".join(wrong))

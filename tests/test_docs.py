"""The documentation stays true to the tree: docs/architecture.rst names every module of
the package, the API reference documents every public name, and README's links to the
pages lead somewhere. (The examples run in tests/test_readme.py; ``tox run -e docs``
builds the site with warnings as errors.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pool

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.rst"
API = DOCS / "api.rst"
PACKAGE = ROOT / "pool"

from_source_tree = pytest.mark.skipif(not ARCHITECTURE.exists(), reason="run from a source tree")


@from_source_tree
def test_the_architecture_page_names_every_module():
    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"[A-Za-z_]+(?=\.py\b)", text))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent != PACKAGE:
            continue  # a package is named by its folder
        if path.stem not in named:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"docs/architecture.rst does not name: {missing}"
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        assert f"{folder.name}/" in text, f"docs/architecture.rst does not name {folder.name}/"


def _documented(module: str) -> set[str]:
    """The names of ``module`` the API reference has an entry for (autodoc or by hand)."""
    return set(re.findall(rf"^\.\. (?:auto\w+|py:\w+):: {re.escape(module)}\.(\w+)\s*$",
                          API.read_text(), re.M))


@from_source_tree
def test_the_api_reference_documents_every_public_name():
    missing = sorted(set(pool.__all__) - _documented("pool"))
    assert not missing, f"docs/api.rst has no entry for: {missing}"


@from_source_tree
def test_the_api_reference_documents_pool_dask():
    # Read, not imported: pool.dask needs distributed, which this environment may lack.
    tree = ast.parse((PACKAGE / "dask.py").read_text())
    public = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "__all__" for t in node.targets))
    missing = sorted(set(public) - _documented("pool.dask"))
    assert not missing, f"docs/api.rst has no entry for pool.dask's: {missing}"


@from_source_tree
def test_readme_links_to_pages_that_exist():
    targets = re.findall(r"`[^`<]*<([^>`]+)>`_", (ROOT / "README.rst").read_text())
    local = [t for t in targets if not re.match(r"\w+://", t)]
    assert local, "README.rst links to no documentation page"
    assert [t for t in local if not (ROOT / t).is_file()] == []
    # Every page of the site is reachable from README (the guide through its own index).
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.rst")
             if "_build" not in p.parts and p.name != "index.rst"}
    assert sorted(pages - set(local)) == []


@from_source_tree
def test_every_install_line_names_the_distribution_not_the_taken_name():
    # "pool" on the package index is another project: pip install pool fetches it.
    texts = {path: path.read_text() for path in [ROOT / "README.rst", *DOCS.rglob("*.rst"),
                                                *PACKAGE.rglob("*.py"),
                                                *(ROOT / "benchmarks").glob("*.py")]}
    installed = [(path.name, target) for path, text in texts.items()
                 for target in re.findall(r"pip install (?:-q )?'?([\w.\[\]-]+)", text)]
    assert installed
    wrong = [(name, target) for name, target in installed
             if target not in {".", "tox", "sturdypool", "sturdypool[dask]"}
             and target.split("[")[0] in {"pool", "pool-executor"}]
    assert not wrong, wrong
    assert ("README.rst", "sturdypool") in installed

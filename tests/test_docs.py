"""docs/architecture.rst stays true to the tree: it names every module of the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.rst"
PACKAGE = ROOT / "pool"


@pytest.mark.skipif(not ARCHITECTURE.exists(), reason="run from a source tree")
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

"""The examples of README.rst and the documentation pages (docs/), for the tests that run
them: tests/test_readme.py, and tests/dask for the one that needs distributed.

An example is a program to run when it is a ``.. code-block:: python`` block (the pages
mark only whole programs so: a fragment is written as a plain ``::`` block), or a ``::``
block that is Python with an ``if __name__ == "__main__":`` guard."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
DOCS_DIR = REPO_DIR / "docs"


def pages() -> list[Path]:
    """README.rst, then every page of the documentation site."""
    return [REPO_DIR / "README.rst",
            *sorted(p for p in DOCS_DIR.rglob("*.rst") if "_build" not in p.parts)]


def page_name(page: Path) -> str:
    return page.relative_to(REPO_DIR).as_posix()


def _blocks(text: str) -> list[tuple[str, str, int]]:
    """Each literal block of a page: (kind, its text dedented, where it ends), kind being
    ``python`` for a ``.. code-block:: python`` and ``literal`` for a ``::`` block."""
    lines = text.split("\n")
    found = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if stripped == ".. code-block:: python":
            kind = "python"
        elif stripped.endswith("::") and not stripped.startswith(".. "):
            kind = "literal"
        else:
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        end = number + 1
        while end < len(lines) and (not lines[end].strip()
                                    or len(lines[end]) - len(lines[end].lstrip()) > indent):
            body.append(lines[end])
            end += 1
        while body and not body[-1].strip():
            body.pop()
        if any(b.strip() for b in body):
            found.append((kind, textwrap.dedent("\n".join(body)).strip("\n") + "\n", end))
    return found


def is_program(source: str) -> bool:
    """Python source with a main guard: a whole program, not a fragment."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
               for node in tree.body)


def programs(page: Path) -> list[str]:
    """The page's examples that are programs to run, in order."""
    return [body for kind, body, _ in _blocks(page.read_text())
            if kind == "python" or is_program(body)]


def literal_blocks_after(page: Path, program: str) -> list[list[str]]:
    """The ``::`` blocks that follow ``program`` on its page, up to the next section: what
    the page shows it prints."""
    text = page.read_text()
    blocks = _blocks(text)
    start = next(end for kind, body, end in blocks if body == program)
    lines = text.split("\n")
    heading = next((n for n in range(start, len(lines) - 1)
                    if lines[n].strip() and not lines[n].startswith(" ")
                    and re.fullmatch(r"([-=~^\"'])\1{3,}", lines[n + 1])), len(lines))
    return [body.rstrip("\n").splitlines() for kind, body, end in blocks
            if kind == "literal" and start < end <= heading]


def run_guide_example(page: str, marker: str, directory: Path, timeout: float = 120) -> str:
    """Runs the one example of ``docs/guide/<page>`` that contains ``marker`` (one the tests
    of tests/test_readme.py leave to an environment of their own), as written, in a
    session of its own; returns what it printed, once it has exited 0 and every process
    of its session is gone."""
    import subprocess
    import sys

    from helpers import session_members, wait_until
    blocks = [block for block in programs(DOCS_DIR / "guide" / page) if marker in block]
    assert len(blocks) == 1, blocks
    script = directory / "example.py"
    script.write_text(blocks[0])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(directory),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-8000:]
    assert wait_until(lambda: not session_members(proc.pid), 15)
    return out

"""What a user installs: the wheel and the sdist that ``python -m build`` makes.

Run by tox's ``release`` environment, which builds both, checks them with ``twine check``
and passes their folder in ``SDIST_WHEEL_DIR``; not by the core matrix (each test here
makes a virtual environment and installs into it from the package index).
Without ``SDIST_WHEEL_DIR`` the tests build a wheel themselves with pip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "sturdypool"
pytestmark = pytest.mark.timeout(600)


def _run(*command: object, cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}: status {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SDIST_WHEEL_DIR")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, ROOT)
    return out


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def _fresh_venv(where: Path) -> Path:
    _run(sys.executable, "-m", "venv", where)
    return where / "bin" / "python"


def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_demo(dist_dir: Path,
                                                                tmp_path: Path) -> None:
    wheel = _one(dist_dir, f"{DISTRIBUTION}-*-py3-none-any.whl")
    python = _fresh_venv(tmp_path / "venv")
    _run(python, "-m", "pip", "install", "-q", wheel)
    # Run from an empty folder, so that the source tree cannot stand in for the install.
    here = tmp_path / "elsewhere"
    here.mkdir()
    where = _run(python, "-c", "import pool; print(pool.__file__)", cwd=here)
    assert str(tmp_path / "venv") in where, where
    out = _run(python, "-m", "pool", "demo", cwd=here, timeout=180)
    assert "3 workers ended" in out and "the pool carried on" in out, out
    # The console script is installed too, under the import name.
    assert "usage" in _run(tmp_path / "venv" / "bin" / "pool", "--help", cwd=here)
    version = _run(python, "-c", "from importlib.metadata import version;"
                                 f"print(version({DISTRIBUTION!r}))", cwd=here).strip()
    assert version == _run(python, "-c", "import pool; print(pool.__version__)", cwd=here).strip()


def test_the_wheel_holds_the_package_and_its_type_marker_only(dist_dir: Path) -> None:
    names = zipfile.ZipFile(_one(dist_dir, "*.whl")).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"pool", f"{DISTRIBUTION}-{_version(dist_dir)}.dist-info"}, tops
    assert "pool/py.typed" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    metadata = next(name for name in names if name.endswith("/METADATA"))
    text = zipfile.ZipFile(_one(dist_dir, "*.whl")).read(metadata).decode()
    assert f"Name: {DISTRIBUTION}\n" in text
    assert "Requires-Python: >=3.11" in text
    for minor in range(11, 16):
        assert f"Programming Language :: Python :: 3.{minor}\n" in text, minor


def _version(dist_dir: Path) -> str:
    return _one(dist_dir, "*.whl").name.split("-")[1]


def test_the_sdist_carries_the_tests_and_docs_and_builds_a_wheel(dist_dir: Path,
                                                                 tmp_path: Path) -> None:
    if not os.environ.get("SDIST_WHEEL_DIR"):
        pytest.skip("only tox's release environment builds the sdist (python -m build)")
    sdist = _one(dist_dir, f"{DISTRIBUTION}-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        archive.extractall(tmp_path, filter="data")
    for needed in ("LICENSE", "README.rst", "tox.ini", "setup.cfg", "pyproject.toml",
                   "pool/py.typed", "tests/conftest.py", "tests/release/test_release.py",
                   "benchmarks/compare.py", "docs/conf.py", "docs/index.rst"):
        assert needed in names, needed
    assert not [name for name in names if "__pycache__" in name]
    built = tmp_path / "built"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", built,
         tmp_path / sdist.name.removesuffix(".tar.gz"))
    _one(built, f"{DISTRIBUTION}-*.whl")

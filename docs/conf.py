"""Sphinx configuration of pool's documentation site (``tox run -e docs``).

Imports nothing at module level beyond the standard library and ``pool`` itself (its
version), and fetches nothing from the network: no intersphinx. ``pool.dask`` needs
distributed, which the docs environment does not install: autodoc mocks it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

import pool  # noqa: E402  (the installed package: tox installs it into the docs env)

project = "pool"
author = "pool's authors"
copyright = "pool's authors"
release = pool.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "pool_cli_help",   # docs/_ext: the command line's --help texts, from its real parsers
]

root_doc = "index"
exclude_patterns = ["_build"]
# Every page's title is its first section; README's own text uses ``code`` for names,
# and so do these pages: no default role guessing.
default_role = None
# Every cross-reference must resolve (tox builds with -n), except these, which cannot:
# type variables and the private helper types in signatures (not part of the API), and
# the stdlib's classes (linking them would need intersphinx, which fetches an inventory
# from the network).
nitpick_ignore_regex = [
    ("py:class", r"[A-Z]"),                        # T, F: type variables
    ("py:class", r"pool\._[a-z_.]+\.[A-Za-z_]+"),  # pool._executor.T, pool._shared._Entry
    ("py:class", r"ProgressTarget"),               # an alias in pool._progress
    ("py:class", r"concurrent\.futures\..*"),
]

# autodoc: members in source order, as each module presents them; signatures keep the
# annotations as written (``from __future__ import annotations`` makes them strings).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_mock_imports = ["distributed", "dask", "click", "psutil", "joblib"]

html_theme = "furo"
html_title = f"pool {release}"
html_show_sourcelink = False

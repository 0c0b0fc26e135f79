"""``.. pool-cli-help:: [demo|map|run]``: the ``--help`` text of ``python -m pool`` (or of
one command), taken from the command line's own parsers when the site is built, so the
reference cannot drift from the code. Output is a literal block, formatted for 88
columns with no colour whatever terminal the build runs in."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

COLUMNS = "88"


@contextmanager
def _plain_terminal() -> Iterator[None]:
    # argparse wraps at $COLUMNS (via shutil.get_terminal_size) and, from 3.14, colours
    # help when stdout is a terminal unless NO_COLOR is set.
    saved = {name: os.environ.get(name) for name in ("COLUMNS", "NO_COLOR", "PYTHON_COLORS")}
    os.environ.update(COLUMNS=COLUMNS, NO_COLOR="1", PYTHON_COLORS="0")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def help_text(command: str | None) -> str:
    """What ``python -m pool [COMMAND] --help`` prints."""
    if command == "run":
        # ``run`` parses its own arguments (everything after PROGRAM is the program's).
        from pool._cli.program import USAGE
        return USAGE
    from pool._cli.options import build_parsers
    with _plain_terminal():
        parser, map_parser = build_parsers()
        if command is None:
            return parser.format_help()
        if command == "map":
            return map_parser.format_help()
        # Every other command is a subparser of the top-level one.
        subparsers = next(action for action in parser._actions
                          if hasattr(action, "choices") and isinstance(action.choices, dict))
        return subparsers.choices[command].format_help()


class PoolCliHelp(SphinxDirective):
    optional_arguments = 1
    has_content = False
    option_spec = {"caption": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        command = self.arguments[0] if self.arguments else None
        try:
            text = help_text(command)
        except Exception as exc:  # a broken parser is a broken build, said where
            raise self.error(f"pool-cli-help {command or ''}: {type(exc).__name__}: {exc}")
        # Rebuilt when the parsers' source changes (Sphinx otherwise keeps the old page).
        import pool._cli.options
        import pool._cli.program
        for module in (pool._cli.options, pool._cli.program):
            self.env.note_dependency(module.__file__)
        block = nodes.literal_block(text.rstrip("\n"), text.rstrip("\n"))
        block["language"] = "text"
        self.set_source_info(block)
        return [block]


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("pool-cli-help", PoolCliHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

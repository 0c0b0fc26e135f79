"""Entry point of ``python -m pool`` (and the ``pool`` console script)."""

from __future__ import annotations

import sys

from ._cli.main import main

if __name__ == "__main__":
    sys.exit(main())

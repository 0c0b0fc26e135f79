"""Back-off: how long to wait after something failed several times in a row.

Owns: nothing but the rule. Runs in: the dispatcher thread, for the machine's parts.
Guarantees: the wait doubles with each time in a row, from ``first`` up to ``most``.
Assumes: the count starts at 1.
"""

from __future__ import annotations


def doubling(first: float, nth: int, most: float) -> float:
    """``first`` for the first time in a row, twice as long each time after, never more
    than ``most``. The exponent is capped: a float power would overflow."""
    return min(first * float(2 ** min(nth - 1, 30)), most)

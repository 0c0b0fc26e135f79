"""Tasks whose tracebacks have carets to check (``test_remote_tracebacks``). Their lines
and columns are what the tests compare: keep each expression as it is."""

from __future__ import annotations

import time
from typing import Any


def divide(x: Any) -> Any:
    return 1 / x


def add(a: Any, b: Any) -> Any:
    return a + b


def multi_line_call(x: Any) -> Any:
    return add(
        x,
        None,
    )


def innermost(x: Any) -> Any:
    return {"k": x}["missing"]


def middle(x: Any) -> Any:
    return innermost(x) * 2


def call_chain(x: Any) -> Any:
    return middle(x) + 1


def chained(x: Any) -> Any:
    try:
        return [x][x + 1]
    except IndexError as exc:
        raise ValueError(f"no item {x + 1}") from exc


class Holder:
    def method(self, x: Any) -> Any:
        return divide(x) + 1


def in_a_method(x: Any) -> Any:
    return Holder().method(x)


def nap(seconds: float) -> None:
    time.sleep(seconds)

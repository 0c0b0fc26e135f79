"""The inputs of ``python -m pool map``: command-line arguments, or records read from a
file descriptor (standard input, or ``-a FILE``).

Runs in: the command's reader thread (``read_inputs``). For ``--progress``, what
``counter`` makes runs in a counting thread beside the reader; it reads with ``pread``.
Guarantees: records are read a block at a time as they are needed, never the whole input
first, so a pipeline streams. Bytes that are not UTF-8 pass through unchanged
(``surrogateescape``). Records are split on newlines, or with ``-0`` on NUL bytes. A
``\\r`` before the newline is part of the line ending. A blank line is an input, the empty
string, so output lines stay aligned with input lines.

A record is the one argument, as text (``--parse str``), or the value it parses into:
``--parse int``, ``float``, ``json`` (``json.loads``) or ``literal``
(``ast.literal_eval``). With ``--jsonl`` each line is JSON: a list is the positional
arguments, an object the keyword arguments, anything else the one argument; blank lines
are skipped. (``--jsonl`` already gives typed arguments: it takes no ``--parse``.) A
record that does not parse is still an input, with its number, that fails without
running (``Input.error``): the run goes on.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import stat
from typing import Any, Callable, Iterable, Iterator, NamedTuple

_BLOCK = 1 << 16

# ``--parse KIND``: what makes a record's text into the function's argument, and the name
# a message gives the kind ("cannot parse 'x' as int").
PARSERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "str": (str, "str"),
    "int": (int, "int"),
    "float": (float, "float"),
    "json": (json.loads, "JSON"),
    "literal": (ast.literal_eval, "a Python literal"),
}


class Unparsed(NamedTuple):
    """Why a record is not an input that can run: it did not parse."""
    error_type: str             # the parser's exception: "ValueError", "JSONDecodeError"
    message: str                # "cannot parse 'x' as int"


class Input(NamedTuple):
    seq: int                    # 1-based position among the inputs
    text: str                   # the record as read, for output lines and the joblog
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    error: Unparsed | None      # why the record cannot be an input, or None
    value: Any                  # what --json output shows as the input: text, or the parsed


def read_inputs(records: Iterable[bytes], jsonl: bool, kind: str = "str") -> Iterator[Input]:
    seq = 0
    for record in records:
        text = record.decode("utf-8", "surrogateescape")
        if jsonl and not text.strip():
            continue
        seq += 1
        yield parse(seq, text, jsonl, kind)


def parse(seq: int, text: str, jsonl: bool = False, kind: str = "str") -> Input:
    """The input that record ``seq`` makes: ``text`` as it is, parsed by ``kind``
    (``PARSERS``), or with ``jsonl`` a JSON line of arguments."""
    assert not (jsonl and kind != "str"), "--jsonl takes no --parse"
    if kind == "str" and not jsonl:
        return Input(seq, text, (text,), {}, None, text)
    parser, name = PARSERS["json" if jsonl else kind]
    try:
        value = parser(text)
    except Exception as exc:  # literal_eval may raise RecursionError, MemoryError, ...
        reason = _reason(exc)
        error = Unparsed(type(exc).__name__, f"cannot parse {short(text)} as {name}"
                         + (f": {reason}" if reason else ""))
        return Input(seq, text, (), {}, error, text)
    if jsonl and isinstance(value, list):
        return Input(seq, text, tuple(value), {}, None, value)
    if jsonl and isinstance(value, dict):
        return Input(seq, text, (), value, None, value)
    return Input(seq, text, (value,), {}, None, value)


def _reason(exc: Exception) -> str:
    """What a parser's exception adds to "cannot parse TEXT as KIND": where, for JSON and
    Python syntax. ``int()``'s and ``float()``'s messages only quote the text again."""
    if isinstance(exc, json.JSONDecodeError):
        where = (f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1
                 else f"column {exc.colno}")
        # Some of its messages end in "at" ("Unterminated string starting at").
        return f"{exc.msg.removesuffix(' at')} at {where}"
    if isinstance(exc, SyntaxError):
        return exc.msg + (f" at column {exc.offset}" if exc.offset else "")
    if isinstance(exc, ValueError):
        return ""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def short(text: Any, limit: int = 60) -> str:
    """An input as a message shows it: its repr, cut to about ``limit`` characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def records_of(fd: int, nul: bool) -> Iterator[bytes]:
    """The records of ``fd``, read lazily. A last record without a separator counts."""
    for record in _split(_blocks(fd), b"\0" if nul else b"\n"):
        yield record if nul else _strip_cr(record)


def records_of_arguments(arguments: list[str]) -> Iterator[bytes]:
    return (os.fsencode(argument) for argument in arguments)


def _blocks(fd: int, offset: int | None = None) -> Iterator[bytes]:
    """The bytes of ``fd`` a block at a time: read, or from ``offset`` without moving the
    file's own offset."""
    while True:
        block = os.read(fd, _BLOCK) if offset is None else os.pread(fd, _BLOCK, offset)
        if not block:
            return
        if offset is not None:
            offset += len(block)
        yield block


def _split(blocks: Iterable[bytes], separator: bytes) -> Iterator[bytes]:
    """Records, in time linear in the input however long a record is: only the new block
    is searched for separators, and a record's start is dropped only once it is whole."""
    pending = bytearray()
    for block in blocks:
        searched = len(pending)
        pending += block
        start = 0
        while True:
            end = pending.find(separator, searched)
            if end < 0:
                break
            yield bytes(pending[start:end])
            start = searched = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending)


def _strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def counter(fd: int, nul: bool, jsonl: bool) -> Callable[[], int] | None:
    """For a regular file, a function that counts its inputs from the current offset, so
    that progress can show an ETA. It reads without moving the offset, so it can run while
    the inputs are read. Otherwise ``None``."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        offset = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return None
    return functools.partial(_count, fd, offset, b"\0" if nul else b"\n", jsonl)


def _count(fd: int, offset: int, separator: bytes, jsonl: bool) -> int:
    if jsonl:
        return sum(1 for record in _split(_blocks(fd, offset), separator) if record.strip())
    total, last = 0, b""
    for block in _blocks(fd, offset):
        total += block.count(separator)
        last = block[-1:]
    return total + (1 if last and last != separator else 0)

"""The inputs of ``python -m pool map``: command-line arguments, or records read from a
file descriptor (standard input, or ``-a FILE``).

Runs in: the command's reader thread (``read_inputs``), and its main thread (``count``).
Guarantees: records are read a block at a time as they are needed, never the whole input
first, so a pipeline streams; bytes that are not UTF-8 pass through unchanged
(``surrogateescape``). Records are split on newlines (a ``\\r`` before the newline is part
of the line ending, and a blank line is an input, the empty string: output lines stay
aligned with input lines) or, with ``-0``, on NUL bytes. With ``--jsonl`` each line is
JSON: a list is the positional arguments, an object the keyword arguments, anything else
the one argument; blank lines are skipped, and a line that is not JSON is an input that
fails with the parse error.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Iterable, Iterator, NamedTuple

_BLOCK = 1 << 16


class Input(NamedTuple):
    seq: int                    # 1-based position among the inputs
    text: str                   # the record as read, for output lines and the joblog
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    error: str | None           # why the record cannot be an input (bad JSON), or None
    value: Any                  # what --json output shows as the input: text, or the JSON


def read_inputs(records: Iterable[bytes], jsonl: bool) -> Iterator[Input]:
    seq = 0
    for record in records:
        text = record.decode("utf-8", "surrogateescape")
        if jsonl and not text.strip():
            continue
        seq += 1
        yield parse(seq, text, jsonl)


def parse(seq: int, text: str, jsonl: bool) -> Input:
    if not jsonl:
        return Input(seq, text, (text,), {}, None, text)
    try:
        value = json.loads(text)
    except ValueError as exc:
        return Input(seq, text, (), {}, f"JSONDecodeError: {exc}", text)
    if isinstance(value, list):
        return Input(seq, text, tuple(value), {}, None, value)
    if isinstance(value, dict):
        return Input(seq, text, (), value, None, value)
    return Input(seq, text, (value,), {}, None, value)


def records_of(fd: int, nul: bool) -> Iterator[bytes]:
    """The records of ``fd``, read lazily. A last record without a separator counts."""
    separator = b"\0" if nul else b"\n"
    pending = b""
    while True:
        block = os.read(fd, _BLOCK)
        if not block:
            break
        pieces = (pending + block).split(separator)
        pending = pieces.pop()
        for piece in pieces:
            yield piece if nul else _strip_cr(piece)
    if pending:
        yield pending if nul else _strip_cr(pending)


def records_of_arguments(arguments: list[str]) -> Iterator[bytes]:
    return (os.fsencode(argument) for argument in arguments)


def _strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def count(fd: int, nul: bool, jsonl: bool) -> int | None:
    """How many inputs ``fd`` holds from its current offset, if it is a regular file (so
    that progress can show an ETA), read without moving the offset; else ``None``."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        offset = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return None
    separator = b"\0" if nul else b"\n"
    total, pending = 0, b""
    while True:
        block = os.pread(fd, _BLOCK, offset)
        if not block:
            break
        offset += len(block)
        if jsonl:
            pieces = (pending + block).split(separator)
            pending = pieces.pop()
            total += sum(1 for piece in pieces if piece.strip())
        else:
            total += block.count(separator)
            pending = block[-1:]
    if jsonl:
        return total + (1 if pending.strip() else 0)
    return total + (1 if pending and pending != separator else 0)

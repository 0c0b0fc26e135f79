"""What a worker runs for one chunk of ``pool.Pool``'s ``map`` and ``imap``: each item on
its own, so that an item's exception fails that item alone.

Owns: nothing. Runs in: a worker, as the chunk task's function (named by reference, so a
worker imports this module alone for it).
Guarantees: the chunk's task returns ``(values, failures)``. ``values[i]`` is item i's
result, or None where ``failures`` holds ``(i, encoded exception)``; each exception is
encoded with its frames, as a task's own is (``_wire.exceptions``), and decoded by the
caller's side. In a worker, each item's outcome is also recorded as it finishes
(``_worker.progress``): if the worker dies, or the chunk times out, the parent still has
the items that finished, and knows which one was running (``_mp_chunks``).
Assumes: ``fn`` and the items came in the chunk's call, unpickled; in a worker, the task
being run is ``_worker.main``'s current one.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

from .._wire.exceptions import encode_exception
from . import main as _main, progress as _progress


# The frames of ours that a failed item's traceback starts with: this module's, the record's.
_OWN_FILES = frozenset({__file__, _progress.__file__})


def run_items(fn: Callable[..., Any], star: bool, items: list[Any]
              ) -> tuple[list[Any], list[tuple[int, bytes]]]:
    """``fn(item)`` for each item (``fn(*item)`` with ``star``), each exception caught.
    The items run in C's loop (``list.extend`` over ``map``), as fast as a plain chunk's;
    an exception leaves the items before it in ``values`` and the iterator at the next."""
    values: list[Any] = []
    failures: list[tuple[int, bytes]] = []
    calls: Iterator[Any] = itertools.starmap(fn, items) if star else map(fn, items)
    recorder = _progress.recorder() if len(items) > 1 else None  # one item: nothing to save
    if recorder is not None and not recorder.begin(_main.current_task_id()):
        recorder = None
    while True:
        try:
            if recorder is None:
                values.extend(calls)
            else:
                recorder.run(calls, values)
            return values, failures
        except BaseException as exc:  # as a task's: SystemExit and the like fail the item
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
                tb = tb.tb_next  # the user's frame first
            exc.__traceback__ = tb
            encoded = encode_exception(exc)
            failures.append((len(values), encoded))
            if recorder is not None:
                recorder.failure(encoded)
            values.append(None)
            del exc, tb, encoded

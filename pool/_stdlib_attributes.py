"""The private attributes of ``ProcessPoolExecutor`` that code outside it reads, kept by
``ProcessPool`` under the same names and with the same meaning.

Owns: nothing; ``StdlibAttributes`` answers from the pool's dispatcher.
Runs in: callers' threads.
Guarantees: ``_processes``, ``_broken`` and ``_executor_manager_thread`` answer what the
stdlib's do, each read when asked. CPython's ``test_concurrent_futures`` reads them, and
so does code that finds or signals workers, or polls for a broken pool.
Assumes: the class that takes these sets ``_dispatcher`` in its constructor, along with
the stdlib's other two, ``_max_workers`` and ``_mp_context``, which are plain values.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._dispatcher.front import Dispatcher


class StdlibAttributes:
    """``_processes``, ``_broken`` and ``_executor_manager_thread``, as the stdlib's
    ``ProcessPoolExecutor`` has them."""

    if TYPE_CHECKING:  # not an annotation at run time: get_type_hints() need not find it
        _dispatcher: Dispatcher

    @property
    def _processes(self) -> dict[int, Any]:
        """The live workers, ``{pid: multiprocessing Process}``, as in the stdlib, where
        code reads it to find or signal workers. The snapshot is taken once the pool's
        thread has acted on every task submitted before. Workers start on demand, on that
        thread, so the workers started for those tasks are listed."""
        return self._dispatcher.live_processes()

    @property
    def _broken(self) -> str | bool:
        """False, or why the pool is broken: its dispatcher failed, or workers kept failing
        to start. As the stdlib's attribute of that name, which code polls."""
        error = self._dispatcher.broken_error
        return False if error is None else str(error)

    @property
    def _executor_manager_thread(self) -> threading.Thread | None:
        """The pool's dispatcher thread (the stdlib's name for its manager thread); None
        before the first ``submit()``. It ends once the pool is shut down and every worker
        is gone."""
        return self._dispatcher.thread

"""``pool.Pool``'s chunks of more than one item, each followed to its end: a death or a
timeout in a chunk costs one item, not the chunk.

Owns: for each such chunk, its items until it has ended, the outcomes of the items that
have, and the future that results wait on (``ChunkRun.future``).
Runs in: the thread that submits the chunk (a caller's, or an imap's feeder); the
dispatcher thread, which only hands a task's end on (``PoolFuture._when_done``); a
callback thread (``run_later``), which decodes what a dead worker recorded and submits the
rest of its chunk.
Guarantees:
- ``future`` ends as a chunk task's does (``_worker.items.run_items``: ``(values,
  failures)``), cancelled if the pool cancelled the chunk, or failed with a task's
  error where no item's outcome is known;
- when the chunk's worker dies, or the chunk overruns ``task_timeout``, the items it
  finished keep their outcomes (``_worker.progress``), the item it was running fails with
  the ``WorkerDied`` or ``TaskTimeout``, and the items after it run again as a new task, in
  the same order. An item that may have run is never run again: where the record stopped
  (a value that does not pickle, or more than the record holds), every item from there on
  fails with the error;
- the pool does not shut down under a chunk that may still need its rest run: it is told
  when the chunk has ended (``release``).
Assumes: ``submit`` submits one chunk task per argument tuple, as the pool's group
submitter does, and each task's error carries ``_worker.progress.ITEM_PROGRESS`` where the
worker recorded that task.
"""

from __future__ import annotations

from concurrent.futures import CancelledError
from typing import Any, Callable

from ._errors import TaskInfo, TaskTimeout, copy_error, rename_task
from ._futures import PoolFuture
from ._worker.progress import ITEM_PROGRESS, ItemProgress

# An item's failure in a chunk's result: an encoded exception (from the worker), or the
# exception itself (from the parent: the task's death, timeout or cancellation).
Failure = tuple[int, "bytes | BaseException"]

Submit = Callable[[list[tuple[Any, ...]]], list[PoolFuture[Any]]]


def terminated() -> CancelledError:
    """What an item fails with that a terminated pool never sent (an imap's feeder, the
    rest of a chunk)."""
    return CancelledError("the pool was terminated before this item was sent")


class ChunkRun:
    """One chunk of ``items``, from its first task to its end."""

    def __init__(self, items: list[Any], submit: Submit,
                 run_later: Callable[[Callable[[], object]], None],
                 may_resubmit: Callable[[], bool],
                 release: Callable[[ChunkRun], None],
                 arguments_of: Callable[[Any], tuple[Any, ...]] = lambda item: (item,)
                 ) -> None:
        self.future: PoolFuture[Any] = PoolFuture()
        self._items = items
        self._submit = submit
        self._run_later = run_later
        self._may_resubmit = may_resubmit  # False once the pool is terminated
        self._release = release            # the pool may shut down as far as we go
        self._arguments_of = arguments_of  # an item's call's arguments, as errors show them
        self._values: list[Any] = []
        self._failures: list[Failure] = []
        self.following = False             # a task of ours is in the pool, or we ended

    def follow(self, task: PoolFuture[Any]) -> None:
        """``task`` runs the items from ``len(self._values)`` on."""
        task._when_done(self._task_ended)
        self.following = True

    def _task_ended(self, task: Any) -> None:
        # On the thread that ended the task (the dispatcher's): look, hand on, no more.
        if task.cancelled():
            if not self._values:
                self._end(cancelled=True)
            else:  # the rest was cancelled (a terminate): what finished stays
                self._run_later(lambda: self._rest_ended(None, CancelledError(
                    "the pool was terminated before this item ran")))
            return
        error = task._exception
        if error is not None and getattr(error, ITEM_PROGRESS, None) is not None:
            self._run_later(lambda: self._recover(error))
            return
        if not self._values:  # the whole chunk, in one task: its outcome is the chunk's
            self._end(result=task._result, error=error)
            return
        self._run_later(lambda: self._rest_ended(task._result, error))

    def _rest_ended(self, result: Any, error: BaseException | None) -> None:
        """A task that ran the rest of the chunk ended (on a callback thread)."""
        try:
            offset = len(self._values)
            if error is None:
                values, failures = result
                self._values.extend(values)
                self._failures.extend((offset + index, failed) for index, failed in failures)
            else:
                self._fail_from(offset, error)
        finally:  # never leave the chunk's results waiting
            self._end(result=(self._values, self._failures))

    def _recover(self, error: BaseException) -> None:
        """The task's worker died (or it timed out) with some of its items recorded: keep
        them, fail the one it was running, run the rest (on a callback thread)."""
        try:
            sent = len(self._items) - len(self._values)  # the items the task ran
            progress: ItemProgress = getattr(error, ITEM_PROGRESS)
            delattr(error, ITEM_PROGRESS)
            if isinstance(error, TaskTimeout):
                # Its timeout is the task's, not the item's: say so beside the item's name.
                error.add_note(f"(it ran in a task of {sent} items of one chunk, whose "
                               f"time limit is task_timeout for each item, "
                               f"{error.timeout:g} s in all)")
            try:
                recorded = progress.outcomes()
            except BaseException:  # a value that does not unpickle here: none is known
                recorded = []
                progress = progress._replace(stopped=True)
            for ok, value in recorded:
                if not ok:
                    self._failures.append((len(self._values), value))
                self._values.append(value if ok else None)
            running = len(self._values)
            if progress.stopped:  # the items from here may have run: none runs again
                self._fail_from(running, error)
            elif running < len(self._items):  # else it died after the last item
                self._failures.append((running, error))  # first: it fails whatever comes
                self._values.append(None)
                self._naming(error, self._items[running])
                rest = self._items[running + 1:]
                if rest and self._submit_rest(rest):
                    return
            self._end(result=(self._values, self._failures))
        except BaseException as exc:  # never leave the chunk's results waiting
            try:
                self._fail_from(len(self._values), exc)
            finally:
                self._end(result=(self._values, self._failures))

    def _naming(self, error: BaseException, item: Any) -> None:
        """Makes ``error`` (a WorkerDied or TaskTimeout of the chunk's task) name the item
        that was running rather than the chunk: ``work(13)``, not ``work([12, 13, ...])``."""
        task = getattr(error, "task", None)
        if isinstance(task, TaskInfo):
            try:
                arguments = self._arguments_of(item)
            except Exception:  # (a starmap item that is not a sequence: as it was sent)
                return
            rename_task(error, TaskInfo(task.task_id, task.fn, arguments, {}))

    def _submit_rest(self, rest: list[Any]) -> bool:
        """Submits the items after the one that failed; False if the pool will not run
        them (then they fail, and the chunk ends)."""
        start = len(self._values)
        if not self._may_resubmit():
            self._fail_from(start, terminated())
            return False
        try:
            (task,) = self._submit([(rest,)])
        except BaseException as exc:  # terminated meanwhile, or broken
            self._fail_from(start, exc if self._may_resubmit() else terminated())
            return False
        self.follow(task)
        return True

    def _fail_from(self, start: int, error: BaseException) -> None:
        """Every item from ``start`` on fails with (a copy of) ``error``."""
        for index in range(start, len(self._items)):
            self._failures.append((index, error if index == start else copy_error(error)))
        self._values.extend([None] * (len(self._items) - start))

    def _end(self, result: Any = None, error: BaseException | None = None,
             cancelled: bool = False) -> None:
        self._items = []
        try:
            if cancelled:
                self.future.cancel()
            elif error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        finally:
            self._release(self)

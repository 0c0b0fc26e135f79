"""``map`` (and ``amap``'s submissions): batching the input, pickling the function once,
submitting lazily, and handing the results back in order.

Owns: nothing that outlives a ``map`` call.
Runs in: the caller's thread. What a worker runs for a chunk, ``process_items`` and
``process_chunk``, lives in ``_worker.main``.
Guarantees:
- the function is pickled once per call, not per chunk;
- a chunk that cannot be pickled fails only its own future, as with the stdlib;
- with ``buffersize`` the input is read lazily, at most that many tasks ahead of the
  results taken;
- leaving the results early cancels what has not started;
- once yielded, a result is referenced by nothing here (CPython's test_free_reference).
Assumes: the caller, ``ProcessPool``, has checked that the pool is open and made its
first-use checks.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Sized

from ._wire import pickling as _pickling
from ._dispatcher.commands import EncodedCall
from ._errors import ArgumentPicklingError, copy_error
from ._futures import PoolFuture, failed_future
from ._latch import Latch
from ._progress import Progress
from ._worker.main import process_chunk, process_items

# Submits encoded calls, in order, as one group. Each is the user's function, its argument
# tuple, no keyword arguments, and the encoded call.
SubmitEncoded = Callable[[list[EncodedCall]], list[PoolFuture[Any]]]
SubmitBatch = Callable[[tuple[Any, ...]], PoolFuture[Any]]
SubmitGroup = Callable[[list[tuple[Any, ...]]], list[PoolFuture[Any]]]

# An eager map over inputs that are all sized (lists, tuples, ranges, arrays), which
# reading cannot block, submits them in groups of up to this many tasks. Each group is one
# command and one wake-up of the pool's thread. Groups start at one task and double, so
# the first tasks start while the rest are pickled. A group also ends once its encoded
# calls hold GROUP_BYTES. Any other input is submitted item by item, as it is read: an
# item must not wait for the next to be produced, and an input may even wait for an
# earlier task's effect.
GROUP_TASKS = 64
GROUP_BYTES = 256 << 10


def groupable(iterables: tuple[Iterable[Any], ...]) -> bool:
    """Whether map's input can be read ahead in groups (see GROUP_TASKS)."""
    return all(isinstance(iterable, Sized) for iterable in iterables)


def check_options(chunksize: int, buffersize: int | None) -> None:
    if not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError("chunksize must be >= 1.")
    if buffersize is not None and not isinstance(buffersize, int):
        raise TypeError("buffersize must be an integer or None")
    if buffersize is not None and buffersize < 1:
        raise ValueError("buffersize must be None or > 0")


def calls(fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...], chunksize: int,
          submit: SubmitEncoded) -> tuple[Iterator[tuple[Any, ...]], SubmitGroup]:
    """The input, read lazily, as argument tuples, and the function that submits a group
    of them through ``submit``. A chunk of ``chunksize`` items is one tuple, run by
    ``process_items`` or ``process_chunk``. The function is pickled once, here."""
    runner, batches = _runner_and_batches(fn, iterables, chunksize)
    return batches, encoded_submitter(fn, runner, submit)


def encoded_submitter(fn: Callable[..., Any], runner: Callable[..., Any],
                      submit: SubmitEncoded,
                      described: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None,
                      scale: Callable[[tuple[Any, ...]], int] | None = None,
                      submit_scaled: Callable[[list[EncodedCall], int],
                                              list[PoolFuture[Any]]] | None = None
                      ) -> SubmitGroup:
    """The function that submits groups of argument tuples for ``runner``, which calls
    ``fn`` (named in errors), through ``submit``. ``runner`` is pickled once, here.
    ``described(args)``, if given, is the arguments that errors show for ``fn``'s call
    (by default, ``args`` themselves). With ``scale``, calls go through
    ``submit_scaled(calls, scale(args))`` instead, consecutive calls of one scale together
    (a chunk's time limit is its items')."""
    try:
        fn_blob = _pickling.dumps_callable(runner)
    except ArgumentPicklingError as exc:
        fn_error: ArgumentPicklingError | None = exc
    else:
        fn_error = None

    def submit_group(group: list[tuple[Any, ...]]) -> list[PoolFuture[Any]]:
        # Each batch fails on its own, as with the stdlib: the others still run.
        if fn_error is not None:
            return [failed_future(copy_error(fn_error)) for _ in group]  # one instance per future
        futures: list[PoolFuture[Any]] = []
        encoded: list[EncodedCall] = []  # not yet submitted, in order
        encoded_bytes = 0
        encoded_scale = 1

        def submit_encoded() -> None:
            nonlocal encoded, encoded_bytes
            if encoded:
                futures.extend(submit(encoded) if submit_scaled is None
                               else submit_scaled(encoded, encoded_scale))
                encoded, encoded_bytes = [], 0

        with _cancelled_if_interrupted(futures):
            for args in group:
                try:
                    body = _pickling.encode_call(fn_blob,
                                                 _pickling.dumps_arguments(fn, args, {}))
                except ArgumentPicklingError as exc:
                    submit_encoded()  # in order: those before it go first
                    futures.append(failed_future(exc))
                    continue
                if scale is not None and (this_scale := scale(args)) != encoded_scale:
                    submit_encoded()  # one scale per submission
                    encoded_scale = this_scale
                encoded.append((fn, args if described is None else described(args), {}, body))
                encoded_bytes += sum(map(len, body))
                if encoded_bytes >= GROUP_BYTES:
                    submit_encoded()
            submit_encoded()
        return futures

    return submit_group


def _runner_and_batches(fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...],
                        chunksize: int) -> tuple[Callable[..., Any], Iterator[tuple[Any, ...]]]:
    """What each task runs, and its argument tuples (a chunk is one tuple)."""
    if chunksize > 1 and len(iterables) == 1:
        chunks = _batched(iter(iterables[0]), chunksize)
        return functools.partial(process_items, fn), ((chunk,) for chunk in chunks)
    if chunksize > 1:
        chunks = _batched(zip(*iterables), chunksize)
        return functools.partial(process_chunk, fn), ((chunk,) for chunk in chunks)
    return fn, zip(*iterables)


def calls_through_submit(fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...],
                         chunksize: int, submit: Callable[..., PoolFuture[Any]]
                         ) -> tuple[Iterator[tuple[Any, ...]], SubmitGroup]:
    """As ``calls``, but each task goes through ``submit(runner, *args)``, as with the
    stdlib's ``map``. That is the pool's ``submit`` as a subclass overrides it or a
    wrapper replaces it: tqdm's ``process_map`` counts its tasks so."""
    runner, batches = _runner_and_batches(fn, iterables, chunksize)

    def submit_group(group: list[tuple[Any, ...]]) -> list[PoolFuture[Any]]:
        futures: list[PoolFuture[Any]] = []
        with _cancelled_if_interrupted(futures):
            for args in group:
                future = submit(runner, *args)
                # The result is handed on once the callbacks added in ``submit`` have run:
                # done-callbacks run in order, on one thread, and this one is added last.
                # A progress bar that counts them is then up to date when map ends.
                ran = Latch()  # not an Event: see _result_or_cancel
                future.add_done_callback(functools.partial(_set_latch, ran))
                future._callbacks_ran = ran  # type: ignore[attr-defined]
                futures.append(future)
        return futures

    return batches, submit_group


@contextlib.contextmanager
def _cancelled_if_interrupted(futures: list[PoolFuture[Any]]) -> Iterator[None]:
    """An interrupt while a group is submitted: what was submitted does not run unseen."""
    try:
        yield
    except BaseException:
        for future in futures:
            future.cancel()
        raise


def _set_latch(latch: Latch, _future: Future[Any]) -> None:
    latch.set()


def one_by_one(submit_group: SubmitGroup) -> SubmitBatch:
    """Submit one batch at a time (``amap``, and a lazy ``map``)."""
    return lambda args: submit_group([args])[0]


def results(batches: Iterator[tuple[Any, ...]], submit_group: SubmitGroup, *, chunksize: int,
            buffersize: int | None, timeout: float | None, progress: Progress | None,
            through: Callable[[Callable[[], PoolFuture[Any]]], PoolFuture[Any]] | None,
            grouped: bool = False) -> Iterator[Any]:
    """Submits the batches, all now or ``buffersize`` ahead, and returns the results in
    input order. They go one by one, as they are read, unless ``grouped`` is true and
    neither ``buffersize`` nor ``through`` is given. ``grouped`` says the input cannot
    block (``groupable``). ``through``, if given, makes each submission: a lease counts
    its own futures. ``progress`` is told the items of each finished task."""
    end_time = None if timeout is None else timeout + time.monotonic()
    submit_one = one_by_one(submit_group)

    def track(future: PoolFuture[Any], args: tuple[Any, ...]) -> PoolFuture[Any]:
        if progress is not None:
            progress.track(future, len(args[0]) if chunksize > 1 else 1)
        return future

    def submit_batch(args: tuple[Any, ...]) -> PoolFuture[Any]:
        future = submit_one(args) if through is None else through(lambda: submit_one(args))
        return track(future, args)

    futures: collections.deque[Future[Any]] = collections.deque()
    try:
        if buffersize is not None or through is not None or not grouped:
            for args in itertools.islice(batches, buffersize):
                futures.append(submit_batch(args))
        else:
            size = 1
            while group := list(itertools.islice(batches, size)):
                submitted = submit_group(group)
                futures.extend(submitted)
                for future, args in zip(submitted, group):
                    track(future, args)
                size = min(2 * size, GROUP_TASKS)
    except BaseException:
        for queued in futures:
            queued.cancel()
        if progress is not None:
            progress.finish(wait=False)
        raise
    ordered = _ordered_results(futures, batches if buffersize else iter(()), submit_batch,
                               end_time, progress)
    return _items_of_chunks(ordered) if chunksize > 1 else ordered


def _items_of_chunks(chunks: Iterator[list[Any]]) -> Iterator[Any]:
    """Flattens ``map``'s chunk results, holding on to no item once it is yielded. A long
    map over large results must not keep them alive (CPython's test_free_reference)."""
    for chunk in chunks:
        chunk.reverse()
        while chunk:
            yield chunk.pop()


def _ordered_results(futures: collections.deque[Future[Any]], more: Iterator[tuple[Any, ...]],
                     submit_batch: SubmitBatch, end_time: float | None,
                     progress: Progress | None) -> Iterator[Any]:
    complete = False
    try:
        while futures:
            args = next(more, None)
            if args is not None:
                futures.append(submit_batch(args))
            timeout = None if end_time is None else end_time - time.monotonic()
            # No local names the future while the result is out with the caller: once
            # yielded, a result is kept alive by nothing here.
            yield _result_or_cancel(futures.popleft(), timeout)
        complete = True
    finally:
        for future in futures:
            future.cancel()
        if progress is not None:  # every result seen: the last counts reach the bar first
            progress.finish(wait=complete)


def _result_or_cancel(future: Future[Any], timeout: float | None) -> Any:
    try:
        try:
            return future.result(timeout)
        except BaseException:  # a timeout, an interrupt; a finished future ignores cancel
            future.cancel()
            raise
        finally:
            # Set by calls_through_submit. A latch: a Ctrl-C in this wait cannot leave a
            # lock taken for the callback thread that sets it (an Event's could).
            ran = getattr(future, "_callbacks_ran", None)
            if ran is not None and future.done():
                ran.wait()
    finally:
        del future  # break the reference cycle with the exception's traceback


def _batched(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk

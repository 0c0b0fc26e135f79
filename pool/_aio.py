"""The asyncio surface of a pool: ``ProcessPool.amap`` and ``as_completed_async`` (and the
waiting they share: ``ProcessPool.run`` and ``pool.to_process`` await a ``PoolFuture``,
whose ``__await__`` is ``_futures``').

Owns: nothing of the pool's; only the asyncio side of waiting for its futures and the
iterators ``amap`` and ``as_completed_async`` return.
Runs in: the event loop's thread. The futures' done-callbacks run on the pool's callback
threads (or in whichever thread resolved a plain ``Future``) and do one thing: hand the
future to the loop with ``loop.call_soon_threadsafe``.
Guarantees:
- waiting is woken by the futures' done-callbacks, never by a timer or a poll (the only
  timer is ``as_completed_async``'s own timeout): an idle await costs no CPU;
- cancelling an ``amap`` iteration stops what it submitted: queued tasks are cancelled,
  running ones stopped (``PoolFuture.stop``: the worker and its process group are killed,
  a new worker takes the slot); leaving an ``amap`` loop early (``break``, an exception,
  ``aclose()``) does the same;
- a task's failure (its exception, ``WorkerDied``, ``TaskTimeout``) is raised by ``amap``
  at its position in the results, after which the rest is stopped;
- ``amap`` reads its input only as it submits, at most ``buffersize`` tasks ahead of the
  results taken, and keeps no reference to a result it has yielded;
- nothing here blocks the loop on the pool: submitting pickles the call (as ``submit``
  does in any caller) and enqueues it; stopping only enqueues a command.
Assumes: an ``amap`` or ``as_completed_async`` iterator is used from one event loop, the
one running when it first waits. An ``amap`` left by ``break`` is closed by asyncio's
async-generator hooks (on CPython, as soon as the loop drops it: the next loop turn), or
at the latest when ``asyncio.run`` ends; ``contextlib.aclosing`` closes it at once.
``asyncio`` is imported on first use, not with ``pool``. The executor imports this module
(when ``amap`` is called), never the reverse: what ``amap`` needs of the pool it is given.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future
from typing import (TYPE_CHECKING, Any, AsyncGenerator, Callable, Generic, Iterable,
                    Iterator, TypeVar, cast)

from ._futures import PoolFuture

if TYPE_CHECKING:
    import asyncio

    from ._executor import ProcessPool

T = TypeVar("T")
F = TypeVar("F", bound="Future[Any]")


def _running_loop() -> asyncio.AbstractEventLoop:
    import asyncio  # here, not at the top: importing pool must not import asyncio
    return asyncio.get_running_loop()


class _Arrivals(Generic[F]):
    """Futures that finish, in the order they finish, handed to the loop's thread.

    ``watch`` adds a done-callback that only calls the loop thread-safely (it runs on the
    pool's callback threads, or at once if the future is done already); ``next`` waits
    for the next arrival. It holds no reference to the iterator that uses it, so a future
    still running does not keep an abandoned ``amap`` alive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._arrived: collections.deque[F] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def watch(self, future: F) -> None:
        future.add_done_callback(self._finished)

    def _finished(self, future: Future[Any]) -> None:  # any thread; the future watched
        try:
            self._loop.call_soon_threadsafe(self._arrive, cast(F, future))
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this any more

    def _arrive(self, future: F) -> None:  # the loop's thread
        self._arrived.append(future)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, deadline: float | None = None) -> F | None:
        """The next future to finish; None if ``deadline`` (in ``loop.time()``) comes
        first."""
        if not self._arrived:
            if deadline is not None and self._loop.time() >= deadline:
                return None
            self._waiter = waiter = self._loop.create_future()
            timer = None if deadline is None else self._loop.call_at(deadline, _wake, waiter)
            try:
                # Woken by an arrival, or by the timer. (Comments go above the lines that
                # a traceback can show: a cancelled wait shows this one.)
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if not self._arrived:
                return None  # the timer's
        return self._arrived.popleft()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


# -- amap ------------------------------------------------------------------------------------

def amap(executor: ProcessPool, fn: Callable[..., T], iterables: tuple[Iterable[Any], ...], *,
         buffersize: int | None, ordered: bool, chunksize: int) -> AsyncGenerator[T, None]:
    """``ProcessPool.amap``: checks its options and that the pool is open now, then returns
    the iterator, which submits on its first step."""
    from ._mapping import one_by_one
    batches, submit_group = executor._map_calls(fn, iterables, chunksize, buffersize)
    return _map_results(_MapRun(batches, one_by_one(submit_group), buffersize, ordered),
                        chunksize > 1)


async def _map_results(run: _MapRun, chunked: bool) -> AsyncGenerator[Any, None]:
    try:
        run.start(_running_loop())
        while run.pending:
            await run.next_done()
            if chunked:
                chunk = run.take()
                chunk.reverse()
                while chunk:
                    yield chunk.pop()  # nothing here keeps an item once it is yielded
            else:
                yield run.take()
    finally:
        run.close()  # without waiting: stopping a task only asks the pool


class _MapRun:
    """One ``amap``'s tasks: ``pending`` holds those submitted and not yet taken (in input
    order; ``_order`` too when ordered), ``_done`` the next one to take once finished."""

    def __init__(self, batches: Iterator[tuple[Any, ...]],
                 submit: Callable[[tuple[Any, ...]], Future[Any]],
                 window: int | None, ordered: bool) -> None:
        self._batches: Iterator[tuple[Any, ...]] | None = batches
        self._submit = submit
        self._window = window
        self._ordered = ordered
        self.pending: dict[Future[Any], None] = {}
        self._order: collections.deque[Future[Any]] = collections.deque()
        self._done: Future[Any] | None = None
        self._arrivals: _Arrivals[Future[Any]] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._arrivals = _Arrivals(loop)
        while self._window is None or len(self.pending) < self._window:
            if not self._submit_next():
                break

    def _submit_next(self) -> bool:
        """Read one more argument tuple and submit it; False once the input is over."""
        if self._batches is None:
            return False
        args = next(self._batches, None)
        if args is None:
            self._batches = None
            return False
        future = self._submit(args)
        self.pending[future] = None
        if self._ordered:
            self._order.append(future)
        else:
            assert self._arrivals is not None
            self._arrivals.watch(future)
        return True

    async def next_done(self) -> None:
        """Wait until the next result to take has finished: the first pending one if
        ordered, else whichever finishes first."""
        assert self._arrivals is not None
        if self._ordered:
            head = self._order[0]
            if not head.done():
                self._arrivals.watch(head)
                await self._arrivals.next()
            done = self._order.popleft()
        else:
            arrived = await self._arrivals.next()
            assert arrived is not None
            done = arrived
        del self.pending[done]
        self._done = done

    def take(self) -> Any:
        """The finished task's result (or its exception, raised); then submits the next
        input, so that at most ``window`` tasks are out whose results were not taken."""
        future, self._done = self._done, None
        assert future is not None and future.done()
        try:
            result = future.result()
        finally:
            del future  # the exception's traceback would keep it (and its result) alive
        self._submit_next()
        return result

    def close(self) -> None:
        """Stop every task not yet taken: cancelled if queued, its worker killed if it
        runs. The newest first: the pool starts queued tasks oldest first, so none of them
        starts while the ones before it are being stopped."""
        self._batches = None
        self._order.clear()
        futures, self.pending = list(self.pending), {}
        for future in reversed(futures):
            if isinstance(future, PoolFuture):
                future.stop()
            else:
                future.cancel()


# -- as_completed_async ----------------------------------------------------------------------

def as_completed_async(fs: Iterable[F], timeout: float | None = None
                       ) -> AsyncGenerator[F, None]:
    """``as_completed`` (``pool.as_completed``, ``concurrent.futures.as_completed``) for
    ``async for``: yields the futures (pool futures or any ``concurrent.futures.Future``)
    as they complete, those already done first; each appears once. If ``timeout``
    seconds (from this call) pass with futures unfinished, raises ``TimeoutError``.
    Waiting costs no CPU: each future's completion wakes the loop.

    The futures are yours: leaving the loop, its timeout, or cancelling it leaves them
    running, as ``concurrent.futures.as_completed`` and ``asyncio.wait`` do; stop one with
    ``future.stop()``, or use ``ProcessPool.amap``, which stops what it started.
    """
    end_time = None if timeout is None else timeout + time.monotonic()
    futures = set(fs)
    for future in futures:
        if not isinstance(future, Future):
            raise TypeError(f"as_completed_async() takes concurrent.futures.Future objects "
                            f"(pool futures are), not {type(future).__name__}; for asyncio "
                            f"futures and tasks, use asyncio.as_completed()")
    return _completed(futures, end_time)


async def _completed(pending: set[F], end_time: float | None) -> AsyncGenerator[F, None]:
    total = len(pending)
    finished = [future for future in pending if future.done()]
    pending.difference_update(finished)
    while finished:
        yield finished.pop()
    if not pending:
        return
    loop = _running_loop()
    arrivals: _Arrivals[F] = _Arrivals(loop)
    for future in pending:
        arrivals.watch(future)
    deadline = None if end_time is None else loop.time() + (end_time - time.monotonic())
    while pending:
        arrived = await arrivals.next(deadline)
        if arrived is None:
            raise TimeoutError(f"{len(pending)} (of {total}) futures unfinished")
        pending.discard(arrived)
        yield arrived

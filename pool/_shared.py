"""The shared pool: one ``ProcessPool`` per process, lent out as leases (``pool.shared()``).

Owns: the registry (the shared pool of the moment, its options, its open leases) and each
``Lease``'s bookkeeping (open or released, its futures, its submissions in progress).
Runs in: the callers' threads, any number at once, and the at-fork hook in a forked child.
The pool itself is an ordinary ``ProcessPool``: its dispatcher thread runs the tasks, and
``pool._exit`` ends it with the interpreter, as every pool.
Guarantees:
- one shared pool at a time: the first ``shared()`` makes it; a later call whose named
  options it has gets a lease on it (an option not named is not asked for);
- a pool with a lease out is never replaced or shut down: a call asking for other options
  raises ``SharedPoolConflict`` naming them. With no lease out such a call replaces the pool
  (the old one finishes what it was given, then ends); so does any call once it is broken;
- ``Lease.shutdown()`` ends that lease only: it refuses new work, and waits for (or with
  ``cancel_futures`` cancels) the lease's own futures, never anyone else's. A lease dropped
  without it is released when it is freed;
- the pool outlives its last lease (its workers exit after ``idle_timeout`` idle, and start
  again on demand) until interpreter exit;
- a forked child never uses its parent's pool: the registry is emptied in the child, which
  makes a pool of its own; a lease it inherited refuses work and releases at once.
Assumes: ``ProcessPool``'s parameters are ``SharedOptions``' keys (asserted); a pool's
constructor, run under the registry's lock, does not call ``shared()``.

``to_process`` is here too: the asyncio helper that runs on the shared pool.
"""

from __future__ import annotations

import inspect
import os
import weakref
from concurrent.futures import Executor
from types import TracebackType
from typing import (Any, Callable, Iterable, Iterator, ParamSpec, TypedDict, TypeVar,
                    Unpack)

from . import _exit
from ._errors import SharedPoolConflict, _safe_repr, callable_name
from ._executor import ProcessPool, _means_stop
from ._futures import PoolFuture
from ._latch import Latch
from ._locks import InterruptSafeLock
from ._options import POOL_DEFAULT, default_context, usable_cpu_count
from ._progress import ProgressTarget

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=PoolFuture[Any])

# The shared pool's default idle_timeout. A pool nobody uses should cost nothing: each
# worker is a whole interpreter with the tasks' imports (tens of MB). A library that calls
# the pool in a loop, or every few seconds, should still find its workers warm (a start
# costs 50-100 ms). A minute covers such gaps many times over and frees the memory within a
# minute of the last task.
IDLE_TIMEOUT = 60.0


class SharedOptions(TypedDict, total=False):
    """``pool.shared()``'s options: ``ProcessPool``'s parameters (see its docstring)."""

    max_workers: int | None
    mp_context: Any
    initializer: Callable[..., Any] | None
    initargs: tuple[Any, ...]
    max_tasks_per_child: int | None
    task_timeout: float | None
    max_memory_per_child: int | None
    stop_grace: float
    terminate_grace: float
    kill_grace: float
    idle_timeout: float | None


class _Entry:
    """The shared pool of the moment: the pool, every option it was made with, those options
    as ``shared()`` compares them, and its open leases (a lease freed unreleased leaves the
    set by itself)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.pool = ProcessPool(**options)
        self.options = options
        self.compared = {name: _compared(name, value) for name, value in options.items()}
        self.leases: weakref.WeakSet[Lease] = weakref.WeakSet()

    def unusable(self) -> bool:
        """The pool is of no use to anyone any more: broken (its dispatcher failed, or its
        initializer kept failing) or shut down."""
        dispatcher = self.pool._dispatcher
        return dispatcher.broken_error is not None or dispatcher.closing


_lock = InterruptSafeLock()  # guards _current and every _Entry.leases; held briefly, by callers
_current: _Entry | None = None
_defaults: dict[str, Any] = {}  # ProcessPool's, with the shared idle_timeout (first call)


def shared(**options: Unpack[SharedOptions]) -> Lease:
    """A lease on the process-wide shared pool, made on first use with ``options``
    (``ProcessPool``'s parameters; ``idle_timeout`` defaults to 60 s here).

    A later call gets a lease on the same pool if the pool has every option it names (none:
    any shared pool will do). ``max_workers=None`` and a missing ``mp_context`` mean the
    defaults, a context is compared by its start method, and everything else with ``==``:
    a function equals only itself, so pass the same module-level function, not a lambda or
    ``functools.partial`` made anew at each call. If an option differs while leases are
    out, raises :class:`pool.SharedPoolConflict` naming it; with no lease out, the pool is
    replaced by one with these options (the old one finishes its tasks, then ends).

    The lease is an executor: ``shutdown()`` (or leaving ``with pool.shared() as ex:``)
    releases it and waits for its own tasks only; the pool lives on for the next lease.
    """
    global _current
    unknown = sorted(set(options) - SharedOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"shared() got an unexpected keyword argument {unknown[0]!r}")
    asked = {name: _compared(name, value) for name, value in options.items()}
    with _lock:
        if _exit.interpreter_exiting:
            raise RuntimeError("cannot lease the shared pool after interpreter shutdown")
        entry = _current
        if entry is not None:
            differing = [name for name, value in asked.items()
                         if not _same(entry.compared[name], value)]
            if differing and entry.leases and not entry.unusable():
                raise SharedPoolConflict(
                    {name: (_shown(name, entry.compared[name]), _shown(name, asked[name]))
                     for name in differing}, len(entry.leases))
            if differing or entry.unusable():
                entry = None  # replaced below, once its successor could be made
        if entry is None:
            entry = _Entry({**_default_options(), **options})
            if _current is not None:
                _current.pool.shutdown(wait=False)  # finishes what it was given, then ends
            _current = entry
        lease = Lease(entry)
        entry.leases.add(lease)
        return lease


class Lease(Executor):
    """A lease on the shared pool (``pool.shared()``): an executor of its own whose
    ``shutdown()`` ends the lease, not the pool.

    ``submit``, ``schedule`` and ``map`` are ``ProcessPool``'s, run in the shared pool;
    their futures are the lease's. ``shutdown(wait=True, cancel_futures=False)`` releases
    the lease: later submissions raise ``RuntimeError``, ``cancel_futures`` cancels the
    lease's tasks still queued, and ``wait`` waits for the lease's own tasks, not other
    leases'. A ``KeyboardInterrupt`` or asyncio cancellation leaving ``with`` / ``async
    with`` stops the lease's tasks (``PoolFuture.stop``) instead of waiting for them; the
    pool and the other leases' tasks go on. There is no ``terminate_workers``: the workers
    are not the lease's to end.
    """

    def __init__(self, entry: _Entry) -> None:
        self._entry = entry
        self._pool = entry.pool
        self._pid = os.getpid()
        self._lock = InterruptSafeLock()  # guards the attributes below; never held while waiting
        self._closed = False
        self._late: Callable[[PoolFuture[Any]], object] | None = None  # for late futures
        self._submitting = 0           # submissions between the check and their future
        self._settled = Latch()        # closed, and no submission in progress
        # Futures that are not done are held by the pool until they are; done ones the
        # lease need not keep.
        self._futures: weakref.WeakSet[PoolFuture[Any]] = weakref.WeakSet()

    @property
    def options(self) -> dict[str, Any]:
        """Every option of the shared pool this lease is on, defaults included."""
        return {**self._entry.options, "max_workers": self._pool._max_workers,
                "mp_context": self._pool._mp_context}

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
               ) -> PoolFuture[T]:
        """``ProcessPool.submit`` in the shared pool."""
        return self._admit(lambda: self._pool.submit(fn, *args, **kwargs))

    def schedule(self, fn: Callable[..., T], /, args: Iterable[Any] = (),
                 kwargs: dict[str, Any] | None = None, *,
                 timeout: float | None = POOL_DEFAULT) -> PoolFuture[T]:
        """``ProcessPool.schedule`` (``submit`` with a per-call ``timeout``)."""
        return self._admit(lambda: self._pool.schedule(fn, args, kwargs, timeout=timeout))

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1, buffersize: int | None = None,
            progress: ProgressTarget | None = None) -> Iterator[T]:
        """``ProcessPool.map`` in the shared pool; its tasks are the lease's."""
        self._check_open()
        return self._pool._map(fn, iterables, timeout, chunksize, buffersize, progress,
                               self._admit)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Release the lease: refuse new work; with ``cancel_futures``, cancel the lease's
        tasks not yet started; with ``wait``, return once the lease's own tasks are done (a
        ``KeyboardInterrupt`` in that wait stops them). The shared pool goes on."""
        if os.getpid() != self._pid:
            return  # inherited by a forked child, where none of its tasks run
        self._close(PoolFuture.cancel if cancel_futures else None)
        if wait:
            try:
                self._wait_for_own()
            except KeyboardInterrupt:
                self._stop_own()
                raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if _means_stop(exc_type):
            self._stop_own()  # do not make the user wait for what they interrupted
        else:
            self.shutdown(wait=True)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """``async with``: as ``with``, but waits for the lease's tasks without blocking the
        event loop; if that wait is cancelled (or interrupted), they are stopped."""
        import asyncio
        if _means_stop(exc_type):
            self._stop_own()
            return
        self._close(None)
        self._settled.wait()  # at most a submission in progress in another thread
        try:
            outstanding = self._outstanding()
            if outstanding:
                await asyncio.wait([asyncio.wrap_future(f) for f in outstanding])
        except BaseException:
            self._stop_own()
            raise

    def __repr__(self) -> str:
        return f"<pool.Lease {'released' if self._closed else 'open'} on {self._pool!r}>"

    def _check_open(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(f"this lease belongs to process {self._pid}; a forked child "
                               f"({os.getpid()}) cannot use it: call pool.shared() there")
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _admit(self, submit: Callable[[], F]) -> F:
        """Make one submission of the lease's: refused once it is released, and counted
        until its future is known, so that ``shutdown()`` misses none of them."""
        self._check_open()  # first: in a forked child, the lock may be a copy held for good
        with self._lock:
            self._check_open()
            self._submitting += 1
        future: F | None = None
        try:
            future = submit()
            return future
        finally:
            with self._lock:
                self._submitting -= 1
                if future is not None:
                    self._futures.add(future)
                if self._closed and not self._submitting:
                    self._settled.set()
                late = self._late if self._closed else None
            if late is not None and future is not None:
                late(future)

    def _close(self, late: Callable[[PoolFuture[Any]], object] | None) -> None:
        """Refuse new work and release the lease (once); do ``late`` to every outstanding
        future, and to those that submissions in progress are making."""
        with self._lock:
            releasing = not self._closed
            self._closed = True
            if late is not None:
                self._late = late
            if not self._submitting:
                self._settled.set()
        if releasing:
            with _lock:
                self._entry.leases.discard(self)
        if late is not None:
            for future in self._outstanding():
                late(future)

    def _outstanding(self) -> list[PoolFuture[Any]]:
        with self._lock:
            futures = list(self._futures)
        return [future for future in futures if not future.done()]

    def _wait_for_own(self) -> None:
        self._settled.wait()
        for future in self._outstanding():
            future._wait_done(None)  # a latch: a Ctrl-C is never lost (contract 9)

    def _stop_own(self) -> None:
        """Release the lease and stop its tasks (queued ones are cancelled, running ones'
        workers killed and replaced); return once they have ended (a second Ctrl-C in
        that wait stops waiting)."""
        self._close(PoolFuture.stop)
        self._wait_for_own()


def _compared(name: str, value: Any) -> Any:
    """An option as ``shared()`` compares it: what it means, not how it was written."""
    if name == "max_workers" and value is None:
        return usable_cpu_count()
    if name == "mp_context":
        context = default_context() if value is None else value
        method = getattr(context, "get_start_method", None)
        return method() if callable(method) else context
    if name == "initargs" and isinstance(value, list):
        return tuple(value)
    return value


def _same(current: Any, asked: Any) -> bool:
    """``==``, which is identity for functions; a comparison that raises (an array among the
    initargs) means different, unless it is the same object."""
    if current is asked:
        return True
    try:
        return bool(current == asked)
    except Exception:
        return False


def _shown(name: str, value: Any) -> str:
    if name == "initializer" and value is not None:
        return callable_name(value)
    return _safe_repr(value)


def _default_options() -> dict[str, Any]:
    """``ProcessPool``'s defaults, with the shared pool's own ``idle_timeout``."""
    if not _defaults:
        parameters = inspect.signature(ProcessPool).parameters
        assert set(parameters) == SharedOptions.__optional_keys__, (
            "SharedOptions must list ProcessPool's parameters", set(parameters))
        _defaults.update({name: p.default for name, p in parameters.items()},
                         idle_timeout=IDLE_TIMEOUT)
    return _defaults


def _forget_in_child() -> None:
    """In a forked child, while it has one thread: its parent's shared pool is not its own.
    The registry is emptied and made anew (another thread may have held its lock at the
    fork); the copy's finalizer is detached, so that dropping the copy sends the parent's
    dispatcher nothing. The child's first ``shared()`` makes a pool of its own."""
    global _lock, _current
    _lock = InterruptSafeLock()
    if _current is not None:
        _current.pool._finalizer.detach()
        _current = None


os.register_at_fork(after_in_child=_forget_in_child)  # cheap: two assignments per fork


def discard() -> None:
    """Forget the shared pool and shut it down, waiting for its workers to be gone. For the
    tests only: no public call shuts down a pool that others may hold leases on."""
    global _current
    with _lock:
        entry, _current = _current, None
    if entry is not None:
        entry.pool.shutdown(wait=True)

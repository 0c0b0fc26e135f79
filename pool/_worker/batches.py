"""What a worker runs for one batch of joblib calls (``pool.joblib``): each call in turn,
inside joblib's configuration for calls nested in it, with the count of calls finished
recorded as they finish.

Owns: nothing. Runs in: the parent, where a ``Batch`` is made and pickled (a caller's
thread, or a pool callback thread that dispatches joblib's next batch); a worker, where
``run_batch`` runs it (named by reference, so a worker imports this module for it, and
joblib when the batch carries a nested configuration).
Guarantees:
- a batch's functions travel by reference where workers can import them, else by value
  (``_wire.pickling.dumps_callable``); those of ``__main__`` go by value, as loky sends
  them, since a worker that imports the script does not run what its ``if __name__ ==
  "__main__":`` defines. Each function is pickled once per batch;
- ``run_batch`` returns the calls' results in order, or raises the first call's exception
  (joblib fails the whole ``Parallel`` call on it);
- in a batch of more than one call, each call's end is recorded (``_worker.progress``, as a
  ``None`` per call: the results stay here), so that when the worker dies or the batch
  times out the parent knows which call was running (``Batch.call``);
- a ``numpy.memmap`` given as an argument of a call is opened again from its file in the
  worker (joblib's memory mapping does the same), so that what the call writes into one
  opened for writing reaches the file, and a large one is not copied;
- ``limit_threads`` caps the BLAS and OpenMP thread pools of a worker at its share of the
  cores, as joblib's own process backends do.
Assumes: a batch's items are joblib's ``(function, args, kwargs)`` triples.
"""

from __future__ import annotations

import mmap
import os
import pickle
import sys
from typing import Any, Callable, Iterator

from .._wire.pickling import dumps_callable, dumps_callable_by_value
from . import main as _main, progress as _progress

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Batch:
    """joblib's calls of one batch, and the configuration that calls nested in them get
    (joblib's ``BatchedCalls``: its nested backend and ``n_jobs``), as the pool sends them.
    Its ``repr`` names the calls, for the pool's messages about the task."""

    def __init__(self, calls: list[Call], nested: tuple[Any, Any] | None = None) -> None:
        self.calls = calls
        self.nested = nested

    def __len__(self) -> int:
        return len(self.calls)

    def __repr__(self) -> str:
        from .._errors import TaskInfo
        shown = [TaskInfo(0, *call).call() for call in self.calls[:3]]
        if len(self.calls) > len(shown):
            shown.append("...")
        return f"<{len(self.calls)} joblib call{'s' * (len(self.calls) != 1)}: " \
               f"{', '.join(shown)}>"

    def call(self, index: int) -> Call:
        return self.calls[index]

    def __reduce__(self) -> tuple[Any, ...]:
        functions: dict[int, int] = {}  # id(function) -> its index in ``blobs``
        blobs: list[bytes] = []
        calls = []
        for function, args, kwargs in self.calls:
            index = functions.get(id(function))
            if index is None:
                index = functions[id(function)] = len(blobs)
                blobs.append(_dumps_function(function))
            numpy = sys.modules.get("numpy")  # (no numpy loaded: no memmap to look for)
            if numpy is not None:
                args = tuple(_by_file(numpy, arg) for arg in args)
                kwargs = {name: _by_file(numpy, value) for name, value in kwargs.items()}
            calls.append((index, args, kwargs))
        return (_rebuilt, (blobs, calls, self.nested))


def _by_file(numpy: Any, value: Any) -> Any:
    """A ``numpy.memmap`` argument, as its file (a ``_FileArray``) where it can be: the
    worker opens the same file, as joblib's memory mapping does, so that what a call
    writes into a memmap opened for writing reaches the file. Anything else, as it is."""
    if not isinstance(value, numpy.memmap) or value.filename is None:
        return value
    mapped = getattr(value, "_mmap", None)  # numpy's: the mmap its data lies in
    if mapped is None or not (value.flags.c_contiguous or value.flags.f_contiguous):
        return value  # (a view numpy made into a plain array, or strided: a copy goes)
    try:
        start = numpy.frombuffer(mapped, dtype=numpy.uint8).ctypes.data
    except (TypeError, ValueError):  # (a closed map)
        return value
    # The map begins at the page boundary below the memmap's own offset.
    mapped_from = value.offset - value.offset % mmap.ALLOCATIONGRANULARITY
    offset = mapped_from + value.ctypes.data - start
    mode = "r+" if value.mode == "w+" else value.mode  # (w+ would empty the file)
    order = "C" if value.flags.c_contiguous else "F"
    return _FileArray(value.filename, value.dtype.str, mode, offset, value.shape, order)


class _FileArray:
    """A ``numpy.memmap`` argument on its way: opened again from its file in the worker."""

    def __init__(self, filename: str, dtype: str, mode: str, offset: int,
                 shape: tuple[int, ...], order: str) -> None:
        self.opening = (filename, dtype, mode, offset, shape, order)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_opened, self.opening)


def _opened(filename: str, dtype: str, mode: str, offset: int, shape: tuple[int, ...],
            order: str) -> Any:
    import numpy
    return numpy.memmap(filename, dtype=dtype, mode=mode, offset=offset, shape=shape,
                        order=order)


def _dumps_function(function: Callable[..., Any]) -> bytes:
    # A function of __main__ goes by value, as loky sends it: it may be defined under the
    # script's ``if __name__ == "__main__":``, where a worker that imports the script does
    # not get to.
    if getattr(function, "__module__", None) == "__main__":
        return dumps_callable_by_value(function)
    return dumps_callable(function)


def _rebuilt(blobs: list[bytes], calls: list[tuple[int, tuple[Any, ...], dict[str, Any]]],
             nested: tuple[Any, Any] | None) -> Batch:
    functions = [pickle.loads(blob) for blob in blobs]
    return Batch([(functions[index], args, kwargs) for index, args, kwargs in calls], nested)


def run_batch(batch: Batch) -> list[Any]:
    """Each call of ``batch``, in order (the worker's side of ``pool.joblib``)."""
    if batch.nested is None:
        return _run(batch.calls)
    from joblib import parallel_config

    from .. import joblib as _registers_the_backend  # a nested Parallel(backend="pool")
    del _registers_the_backend
    backend, n_jobs = batch.nested
    with parallel_config(backend=backend, n_jobs=n_jobs):
        return _run(batch.calls)


def _run(calls: list[Call]) -> list[Any]:
    results: list[Any] = []
    recorder = _progress.recorder() if len(calls) > 1 else None
    if recorder is None or not recorder.begin(_main.current_task_id()):
        results.extend(function(*args, **kwargs) for function, args, kwargs in calls)
        return results
    # The recorder keeps a None for each call that ended (cheap to record); the results
    # stay here.
    recorder.run(_each(calls, results), [])
    return results


def _each(calls: list[Call], results: list[Any]) -> Iterator[None]:
    for function, args, kwargs in calls:
        results.append(function(*args, **kwargs))
        yield None


# The variables that size the thread pools of BLAS, OpenMP and their kin (joblib's list).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS")


def limit_threads(environment: dict[str, str], threads: int,
                  initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
    """A worker's initializer: set ``environment`` (the thread variables) before any
    library reads it. Where a native library is already loaded (the worker was forked from
    a parent that had imported numpy), its pools are sized now through ``threadpoolctl``,
    if installed. Then the user's own initializer, if any."""
    os.environ.update(environment)
    if "numpy" in sys.modules or "scipy" in sys.modules:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            pass
        else:
            threadpool_limits(threads)
    if initializer is not None:
        initializer(*initargs)

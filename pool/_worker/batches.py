"""What a worker runs for one batch of joblib calls (``pool.joblib``): each call in turn,
inside joblib's configuration for calls nested in it, with the count of calls finished
recorded as they finish.

Owns: nothing. Runs in: the parent, where a ``Batch`` is made and pickled (a caller's
thread, or a pool callback thread that dispatches joblib's next batch); a worker, where
``run_batch`` runs it (named by reference, so a worker imports this module for it, and
joblib when the batch carries a nested configuration).
Guarantees:
- a batch travels as loky sends one, with cloudpickle's pickler: what it holds of
  ``__main__`` goes by value (a worker that imports the script does not run what its ``if
  __name__ == "__main__":`` defines, and one of a notebook has no script to import), the
  rest by reference; large buffers still go through shared memory. Each function, and
  each object a method is bound to, is pickled once per batch;
- ``run_batch`` returns the calls' results in order, or raises the first call's exception
  (joblib fails the whole ``Parallel`` call on it);
- in a batch of more than one call, the calls that ended are counted as they end
  (``_worker.progress``, ``Recorder.count``: the results stay here), so that when the
  worker dies or the batch times out the parent knows which call was running
  (``Batch.call``);
- a ``numpy.memmap`` given as an argument of a call is opened again from its file in the
  worker (joblib's memory mapping does the same), so that what the call writes into one
  opened for writing reaches the file, and a large one is not copied;
- ``prepare_worker`` caps the BLAS and OpenMP thread pools of a worker at its share of
  the cores, as joblib's own process backends do, and registers the backend there too.
Assumes: a batch's items are joblib's ``(function, args, kwargs)`` triples.
"""

from __future__ import annotations

import importlib
import mmap
import os
import sys
from typing import Any, Callable

from .._wire.pickling import ARGUMENTS_BY_VALUE
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
        # The calls travel as they are, pickled by value (``run_batch``'s
        # ARGUMENTS_BY_VALUE): cloudpickle sends what is of ``__main__`` by value, keeping
        # file names, and each function, method object and large buffer once. Only a
        # memmap argument is swapped for its file.
        numpy = sys.modules.get("numpy")  # (no numpy loaded: no memmap to look for)
        if numpy is None:
            return (Batch, (self.calls, self.nested))
        calls = [(function, tuple(_by_file(numpy, arg) for arg in args),
                  {name: _by_file(numpy, value) for name, value in kwargs.items()})
                 for function, args, kwargs in self.calls]
        return (Batch, (calls, self.nested))


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
    numpy = importlib.import_module("numpy")  # (present: the caller had a memmap)
    return numpy.memmap(filename, dtype=dtype, mode=mode, offset=offset, shape=shape,
                        order=order)


def run_batch(batch: Batch) -> list[Any]:
    """Each call of ``batch``, in order (the worker's side of ``pool.joblib``)."""
    if batch.nested is None:
        return _run(batch.calls)
    from joblib import parallel_config
    backend, n_jobs = batch.nested
    with parallel_config(backend=backend, n_jobs=n_jobs):
        return _run(batch.calls)


# A batch's arguments go by value (cloudpickle), as loky sends them: an instance of a class
# of a notebook, or of one defined under a script's ``if __name__ == "__main__":`` (a custom
# estimator in a search), reaches workers that could not import it.
setattr(run_batch, ARGUMENTS_BY_VALUE, True)


def _run(calls: list[Call]) -> list[Any]:
    results: list[Any] = []
    recorder = _progress.recorder() if len(calls) > 1 else None
    if recorder is None or not recorder.begin(_main.current_task_id()):
        results.extend(function(*args, **kwargs) for function, args, kwargs in calls)
        return results
    # The recorder counts the calls that ended (their results stay here): which one was
    # running is all the parent needs when the worker dies.
    recorder.count((function(*args, **kwargs) for function, args, kwargs in calls), results)
    return results


# The variables that size the thread pools of BLAS, OpenMP and their kin (joblib's list).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS")


def prepare_worker(environment: dict[str, str], threads: int, backend: type[Any],
                   initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
    """A worker's initializer. Sets ``environment`` (the thread variables) for the native
    libraries loaded from now on, and sizes the pools of those already loaded through
    ``threadpoolctl`` (a dependency of the ``joblib`` extra). They are, often: a worker
    forked from a parent that had imported numpy, or started from a forkserver or by spawn
    with a main module that imports it, has it before any initializer runs. Registers
    ``backend`` (``pool.joblib.PoolBackend``, which the parent sends) as joblib's
    ``"pool"``, for a ``Parallel(backend="pool")`` in a call, whether or not the code that
    runs here imported ``pool.joblib``. Then the user's own initializer, if any."""
    os.environ.update(environment)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(threads)
    from joblib import register_parallel_backend
    register_parallel_backend("pool", backend)
    if initializer is not None:
        initializer(*initargs)

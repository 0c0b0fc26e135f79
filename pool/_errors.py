"""Every exception the pool itself raises, and how a task is named in them.

Owns: the public error classes and ``TaskInfo``, the description of a call used in messages.
Runs in: any thread. Messages are built lazily in ``__str__`` so that the dispatcher thread,
which creates some of these objects, never calls user code such as an argument's ``__repr__``.
Guarantees: pool failures subclass ``BrokenProcessPool`` where a stdlib handler written for
``ProcessPoolExecutor`` should still catch them; a task's own exceptions are never wrapped.
Every class here pickles and unpickles to an equal message.
"""

from __future__ import annotations

import pickle
import reprlib
import signal
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

__all__ = [
    "TaskInfo",
    "WorkerDied",
    "TaskTimeout",
    "WorkerTerminated",
    "InitializerError",
    "WorkerStartRefused",
    "PoolInternalError",
    "WorkerProtocolError",
    "RemoteTaskError",
    "ResultTransferError",
    "ArgumentPicklingError",
    "ArgumentUnpicklingError",
    "SharedPoolConflict",
]

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 4
_short.maxlevel = 3
# Nested containers multiply even shortened reprs: dask hands its workers lists of tuples
# of keys and bytes. No argument takes more than this in a message.
MAX_ARGUMENT_CHARS = 100


def _safe_repr(obj: object) -> str:
    try:
        text = _short.repr(obj)
        if len(text) > MAX_ARGUMENT_CHARS:
            text = text[:MAX_ARGUMENT_CHARS - 3] + "..."
        return text
    except Exception as exc:  # a broken __repr__ must not hide the real error
        return f"<{type(obj).__name__} object (repr failed: {type(exc).__name__})>"


def callable_name(fn: object) -> str:
    """The dotted name of a callable, for messages (``module.qualname`` when known)."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and not hasattr(fn, "__qualname__"):
        return f"partial({callable_name(inner)})"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{qualname}" if module else str(qualname)


class TaskInfo:
    """A submitted call as errors describe it: id, callable, and arguments.

    Keeps references to the call itself (as the pending future does anyway) and renders
    them only when a message is asked for, in the asking thread.
    """

    __slots__ = ("task_id", "fn", "args", "kwargs")

    def __init__(self, task_id: int, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.task_id = task_id
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    @property
    def function_name(self) -> str:
        return callable_name(self.fn)

    def describe(self) -> str:
        """``task 7: mod.fn(1, 'x', key=...)`` with every argument shortened."""
        parts = [_safe_repr(a) for a in self.args]
        parts += [f"{k}={_safe_repr(v)}" for k, v in self.kwargs.items()]
        return f"task {self.task_id}: {self.function_name}({', '.join(parts)})"

    def call(self) -> str:
        """``mod.fn(1, 'x', key=...)``: the call alone, as ``describe`` shows it."""
        return self.describe().partition(": ")[2]

    def __repr__(self) -> str:
        return f"<TaskInfo {self.describe()}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # The call itself may not pickle (that may be why we are here): keep its text.
        return (_DescribedTask, (self.task_id, self.function_name, self.describe()))


class _DescribedTask(TaskInfo):
    """What a ``TaskInfo`` becomes after pickling: names and text only."""

    __slots__ = ("_name", "_text")

    def __init__(self, task_id: int, name: str, text: str) -> None:
        super().__init__(task_id, _DescribedTask, (), {})
        self._name = name
        self._text = text

    @property
    def function_name(self) -> str:
        return self._name

    def describe(self) -> str:
        return self._text

    def __reduce__(self) -> tuple[Any, ...]:
        return (_DescribedTask, (self.task_id, self._name, self._text))


def rename_task(error: BaseException, named: TaskInfo) -> None:
    """Makes a task's ``WorkerDied`` or ``TaskTimeout`` name ``named`` instead of the task:
    a face that ran several calls in one task names the call that was running."""
    task = getattr(error, "task", None)
    error.task = named  # type: ignore[attr-defined]
    error.args = tuple(named if arg is task else arg for arg in error.args)


def describe_exit(exitcode: int | None) -> str:
    """``exit code 3`` / ``signal SIGKILL (9)``, from a ``Process.exitcode``."""
    if exitcode is None:
        return "no exit status (not reaped)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "signal"
        return f"signal {name} ({-exitcode})"
    return f"exit code {exitcode}"


# What a worker's stack shows, in place of a frame, for a thread that was inside a callable
# with no Python frame of its own (a built-in function, C code) that the pool's worker
# called: the task's function itself, or the function a ``map`` chunk calls on each input.
# ``_worker.teardown`` writes them into a crash report; ``TaskTimeout`` and ``WorkerDied``
# name the task's call in the first.
IN_THE_TASK_FUNCTION = ("  in the task's function itself, which is not Python code (a "
                        "built-in or C function called directly as the task)")
IN_THE_MAPPED_FUNCTION = ("  in the function called on each input, which is not Python "
                          "code (a built-in or C function called directly on the input)")


def _naming_the_call(stack: str, task: TaskInfo) -> str:
    """The stack, with the task's call named where the worker was inside it."""
    if IN_THE_TASK_FUNCTION not in stack:
        return stack
    return stack.replace(IN_THE_TASK_FUNCTION,
                         f"  in {task.call()}, which is not Python code (a built-in or C "
                         f"function called directly as the task)")


class WorkerDied(BrokenProcessPool):
    """The worker process running this task died before replying.

    Raised by ``future.result()`` of exactly the task that was running when its worker
    ended: killed by a signal (SIGKILL, SIGSEGV, SIGABRT...) or exited (``os._exit``).
    The dispatcher creates it when it sees the worker's sentinel. Other tasks and the pool
    are unaffected. The task is not re-run: it may have had side effects.

    Attributes: ``pid``; ``exitcode``, negative for a signal, as ``Process.exitcode``;
    ``signal_name``, ``"SIGKILL"`` or ``None``; ``task``, a :class:`TaskInfo`;
    ``crash_report``, what the worker's faulthandler wrote while dying, or ``None``;
    ``ended_because``, why the pool itself ended a worker it could no longer watch, or "".
    """

    def __init__(self, pid: int, exitcode: int | None, task: TaskInfo,
                 crash_report: str | None = None, ended_because: str = "") -> None:
        super().__init__(pid, exitcode, task, crash_report, ended_because)
        self.pid = pid
        self.exitcode = exitcode
        self.task = task
        self.crash_report = crash_report or None
        self.ended_because = ended_because

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return None

    def __str__(self) -> str:
        how = describe_exit(self.exitcode)
        text = f"worker pid {self.pid} died ({how}) while running {self.task.describe()}"
        if self.ended_because:
            text += "\n" + self.ended_because
        elif self.signal_name == "SIGKILL":
            text += ("\nThe process was killed from outside (SIGKILL cannot be caught): "
                     "by another process, or by the kernel's OOM killer when memory ran out.")
        if self.crash_report:
            text += ("\nCrash report from the worker:\n"
                     + _naming_the_call(self.crash_report, self.task).rstrip())
        elif self.exitcode is not None and self.exitcode >= 0:
            text += "\nThe worker exited without a Python error (os._exit or a C-level exit)."
        return text


class TaskTimeout(TimeoutError):
    """The task ran longer than its timeout, so the pool stopped it.

    Raised by ``future.result()`` of a task that was still running when its time was up,
    counted from the moment it started running. The timeout is the pool's
    ``task_timeout=``, or ``timeout=`` of :meth:`ProcessPool.schedule`. The parent enforces
    it: the worker is asked to write its Python stack, then it and its process group are
    killed and replaced. ``TimeoutError`` catches it; ``future.result(timeout)`` raises
    that too.

    Attributes: ``timeout`` (seconds), ``task`` (a :class:`TaskInfo`), ``pid`` and
    ``stack``: where the task was when its time ran out (every thread of the worker, the
    task's first), or ``None`` if the worker could not write it. A task's function with no
    Python frame of its own (``time.sleep`` as the task) shows as a line saying so
    (``IN_THE_TASK_FUNCTION``), which the message replaces with the call.
    """

    def __init__(self, timeout: float, pid: int, task: TaskInfo,
                 stack: str | None = None) -> None:
        super().__init__(timeout, pid, task, stack)
        self.timeout = timeout
        self.pid = pid
        self.task = task
        self.stack = stack or None

    def __str__(self) -> str:
        text = (f"{self.task.describe()} ran longer than its timeout of {self.timeout:g} s "
                f"and was stopped (worker pid {self.pid}, killed with its process group).")
        if self.stack:
            return (text + "\nWhere it was when the time ran out:\n"
                    + _naming_the_call(self.stack, self.task).rstrip())
        return text + "\n(The worker did not write its stack in time.)"


class WorkerTerminated(BrokenProcessPool):
    """The task was running when the pool was told to end its workers.

    Raised by ``future.result()`` of each task that ``terminate_workers()`` or
    ``kill_workers()`` ended. A ``KeyboardInterrupt`` that leaves a ``with`` block, and the
    end of the interpreter, call them too. Tasks that had not started are cancelled
    instead. Attributes: ``pid``, ``exitcode`` and ``task``.
    """

    def __init__(self, pid: int, exitcode: int | None, task: TaskInfo) -> None:
        super().__init__(pid, exitcode, task)
        self.pid = pid
        self.exitcode = exitcode
        self.task = task

    def __str__(self) -> str:
        return (f"{self.task.describe()} was running on worker pid {self.pid} when the pool "
                f"ended its workers ({describe_exit(self.exitcode)})")


class InitializerError(BrokenProcessPool):
    """Workers kept failing to start, so the pool stopped starting them.

    Raised by ``future.result()`` of every task that was waiting, and by later ``submit()``
    calls, after several consecutive worker starts failed with no task completed in
    between: the ``initializer`` raised, or the worker died while starting. ``__cause__`` is
    the initializer's own exception with its remote traceback when it could be transferred;
    ``remote_traceback`` always holds it as text.
    """

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message, remote_traceback)
        self.message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        if not self.remote_traceback:
            return self.message
        return f"{self.message}\n{self.remote_traceback.rstrip()}"


class WorkerStartRefused(BrokenProcessPool):
    """The system kept refusing to start workers, and no worker was left to run the task.

    Raised by ``future.result()`` of the tasks that were waiting when starts had been
    refused several times in a row, over about 1.3 s, with no worker running. The process
    ran out of descriptors (``RLIMIT_NOFILE``), the user of processes (``RLIMIT_NPROC``), or
    the machine of memory. The message says which, with the limit; ``__cause__`` is the
    ``OSError``. The pool stays open and keeps trying, less often: tasks submitted later
    run once a worker starts, or fail the same way at the next refused try.
    """


class PoolInternalError(BrokenProcessPool):
    """The pool's dispatcher thread failed: a bug in the pool, not in your task.

    Raised by ``future.result()`` of every task not yet resolved at that moment and by every
    later ``submit()``; ``__cause__`` is the internal error. The workers are killed; nothing
    waits forever. Please report it with the chained traceback.
    """


class WorkerProtocolError(BrokenProcessPool):
    """A worker sent bytes that are not a valid reply: something in the task wrote into the
    pool's pipe, or memory was corrupted. Raised by ``future.result()`` of the task that
    was running on that worker; the worker is killed and replaced.
    """


class RemoteTaskError(BrokenProcessPool):
    """The task raised an exception that could not be brought back as itself.

    Raised by ``future.result()`` when the parent could not unpickle the task's exception:
    for example a class whose ``__init__`` needs arguments that ``args`` does not hold, or a
    class the parent cannot import. A ``BrokenProcessPool``, as the stdlib raises there; the
    stdlib also breaks the pool, while here only this future fails. When the *worker*
    cannot pickle the exception, ``result()`` raises the pickling error itself, as the
    stdlib does, and this class is its ``__cause__``. Carries the original ``type_name``,
    ``message`` and the worker's ``remote_traceback`` as text, and ``reason``: why the
    exception itself could not be transferred.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str,
                 reason: str) -> None:
        super().__init__(type_name, message, remote_traceback, reason)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback
        self.reason = reason

    def __str__(self) -> str:
        return (f"{self.type_name}: {self.message}\n"
                f"(the exception could not be transferred from the worker: {self.reason})\n"
                f"Remote traceback:\n{self.remote_traceback.rstrip()}")


class ResultTransferError(BrokenProcessPool):
    """The task returned, but the parent could not unpickle its return value.

    Raised by ``future.result()`` of that task only. The stdlib raises ``BrokenProcessPool``
    here and breaks the pool; this is a ``BrokenProcessPool`` too. ``__cause__`` is the
    unpickler's error. ``stage`` is ``"unpickling in the parent"``, or ``"receiving in the
    parent"`` when the parent had no memory for the reply; ``__cause__`` is then a
    ``MemoryError``. ``reason`` says what failed. A value the *worker* cannot pickle
    raises the pickling error itself, as in the stdlib, with a note naming the value's
    type. The worker and the pool carry on.
    """

    def __init__(self, type_name: str | None, stage: str, reason: str) -> None:
        super().__init__(type_name, stage, reason)
        self.type_name = type_name
        self.stage = stage
        self.reason = reason

    def __str__(self) -> str:
        what = f"a {self.type_name}" if self.type_name else "a value"
        return f"the task returned {what} that failed {self.stage}: {self.reason}"


class ArgumentPicklingError(pickle.PicklingError):
    """The task's function or arguments cannot be pickled.

    Raised by ``future.result()`` of that task. ``submit()`` and ``map()`` return a future
    that has already failed with it, as the stdlib's future fails, so a loop of submits is
    not cut short. Nothing is sent to a worker. Names the argument, or the function, that
    failed, and chains the pickler's own error as ``__cause__``. A ``pickle.PicklingError``,
    and also an instance of the pickler's own error's type where it can be: a ``TypeError``
    for a lock, as the stdlib raises. So ``except PicklingError`` and ``except TypeError``
    written for the stdlib both catch it. The constructor raises it for an initializer that
    cannot be sent to workers.
    """


_ARGUMENT_ERROR_TYPES: dict[type[BaseException], type[ArgumentPicklingError]] = {}


def argument_pickling_error(message: str, cause: BaseException) -> ArgumentPicklingError:
    """An ``ArgumentPicklingError`` that is also an instance of the pickler's own error, so
    that both ``except TypeError`` and ``except PicklingError`` still match. The stdlib's
    future raises ``TypeError: cannot pickle '_thread.lock' object``. Where the two cannot
    be combined, for an exception type with its own layout, a plain one."""
    base = type(cause)
    if issubclass(base, ArgumentPicklingError) or not issubclass(base, Exception):
        return ArgumentPicklingError(message)
    combined = _ARGUMENT_ERROR_TYPES.get(base)
    if combined is None:
        try:
            combined = type("ArgumentPicklingError", (ArgumentPicklingError, base), {
                "__module__": ArgumentPicklingError.__module__,
                "__qualname__": "ArgumentPicklingError",
                "__doc__": ArgumentPicklingError.__doc__,
                "__init__": Exception.__init__,
                "__str__": Exception.__str__,
                # Pickles (and so travels) as the plain public class.
                "__reduce__": lambda self: (ArgumentPicklingError, self.args),
            })
        except TypeError:  # "multiple bases have instance lay-out conflict"
            combined = ArgumentPicklingError
        _ARGUMENT_ERROR_TYPES[base] = combined
    try:
        return combined(message)
    except Exception:
        return ArgumentPicklingError(message)


class ArgumentUnpicklingError(BrokenProcessPool):
    """The worker could not unpickle the task's function or arguments.

    Raised by ``future.result()`` of that task: for example, the function's module cannot
    be imported in the worker, or an argument's reducer raises there. ``__cause__`` is the
    worker's own error, with its remote frames. A ``BrokenProcessPool``, as the stdlib
    raises here. There the worker dies and the pool breaks; here the worker carries on.
    """


class SharedPoolConflict(RuntimeError):
    """``pool.shared()`` was asked for options the shared pool does not have, while leases
    on it are out.

    Raised by ``pool.shared(**options)`` only: the shared pool is never restarted under the
    code that holds leases on it. ``differing`` maps each option asked for that differs to
    ``(the shared pool's value, the value asked for)``, as text; ``leases`` is how many
    leases were out. Release them first: with no lease out, a call with other options
    replaces the pool. Or ask for no options, and any shared pool will do. Or use a
    ``ProcessPool`` of your own.
    """

    def __init__(self, differing: dict[str, tuple[str, str]], leases: int) -> None:
        super().__init__(differing, leases)
        self.differing = differing
        self.leases = leases

    def __str__(self) -> str:
        asked = ", ".join(f"{name}={value}" for name, (_, value) in self.differing.items())
        has = ", ".join(f"{name}={value}" for name, (value, _) in self.differing.items())
        out = "1 lease is" if self.leases == 1 else f"{self.leases} leases are"
        return (f"pool.shared({asked}): the shared pool has {has} and {out} out on it, so "
                f"it cannot be replaced; release the leases first, ask for no options, or "
                f"use a ProcessPool of your own")


# The public exceptions print in tracebacks, and pickle, as ``pool.WorkerDied``, not as
# ``pool._errors.WorkerDied``. Pickles by reference resolve through the package, which
# exports every one of them and loads this module on first use. Only exceptions: classes
# with annotations of their own must keep their module, or typing.get_type_hints breaks.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and issubclass(_obj, BaseException):
        _obj.__module__ = "pool"
del _name, _obj


def copy_error(error: BaseException) -> BaseException:
    """A new instance of ``error`` to raise in one more place, with its message, attributes
    and cause. One exception raised in several threads would share its traceback, each
    raise adding frames of another thread to it."""
    copy = type(error).__new__(type(error))
    copy.__dict__.update(getattr(error, "__dict__", {}))
    copy.args = error.args
    copy.__cause__ = error.__cause__
    return copy

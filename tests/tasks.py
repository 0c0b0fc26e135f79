"""Task functions for the tests; importable by workers under every start method."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import signal
import time


def identity(x):
    return x


def square(x):
    return x * x


def add(a, b=0, *, c=0):
    return a + b + c


def pid_of_worker(_=None):
    return os.getpid()


def raise_value_error(message="boom"):
    raise ValueError(message)


def raise_chained():
    try:
        try:
            {}["missing"]
        except KeyError as inner:
            raise OSError(2, "no such thing") from inner
    except OSError:
        raise RuntimeError("outer")  # __context__ is the OSError


def segfault():
    ctypes.string_at(0)


def abort():
    os.abort()


def exit_hard(code=3):
    os._exit(code)


def sigkill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def sleep_then(seconds, value=None):
    time.sleep(seconds)
    return value


def wait_for_file(path, value=None, timeout=30):
    """Block until ``path`` exists (a test releases it); returns ``value``."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.005)
    return value


EFFECTS = {
    "segfault": segfault,
    "abort": abort,
    "exit": lambda: exit_hard(3),
    "sigkill": sigkill_self,
    "raise": lambda: raise_value_error("effect"),
    "systemexit": lambda: exec("raise SystemExit('effect')"),
    "hang": lambda: time.sleep(60),
}



def touch(path):
    """Create the file at ``path``; return the path."""
    open(path, "a").close()
    return path


def do_effect(effect):
    EFFECTS[effect]()
    return "survived"


def _detonate_on_unpickle(effect, where_pid_is_not):
    # Runs where the object is unpickled: in a worker (receive stage) when the parent's
    # pid is given, in the parent (parent-receive stage) when a worker's is given.
    if os.getpid() != where_pid_is_not:
        EFFECTS[effect]()
    return "defused"


class UnpickleBomb:
    """Pickles fine; unpickling anywhere but in process ``safe_pid`` runs ``effect``."""

    def __init__(self, effect, safe_pid):
        self.effect, self.safe_pid = effect, safe_pid

    def __reduce__(self):
        return (_detonate_on_unpickle, (self.effect, self.safe_pid))


class PickleBomb:
    """Pickling it runs ``effect`` (in the worker, when it is a task's return value)."""

    def __init__(self, effect):
        self.effect = effect

    def __reduce__(self):
        EFFECTS[self.effect]()
        return (str, ("survived",))


def return_pickle_bomb(effect):
    return PickleBomb(effect)


def return_unpickle_bomb_for_parent(effect):
    return UnpickleBomb(effect, os.getpid())  # safe in this worker, goes off in the parent


def take_argument(_):
    return "received"


class NeedsTwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")
        self.a, self.b = a, b


def raise_needs_two_args():
    raise NeedsTwoArgs(1, 2)


class WithoutDict(Exception):
    """As a compiled (mypyc) exception class is: an ``__init__`` of its own, the default
    ``__reduce__``, and no ``__dict__`` (black's ``InvalidInput``)."""

    def __init__(self, message):
        super().__init__(message)

    @property
    def __dict__(self):
        raise AttributeError(f"{type(self).__qualname__!r} object has no attribute "
                             f"'__dict__'")


def raise_without_dict():
    raise WithoutDict("Cannot parse: 1:11: def broken(:")


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = __import__("threading").Lock()


def raise_unpicklable():
    raise Unpicklable("has a lock")


class FailsInParent(Exception):
    """Unpickling works in the worker, fails in the parent (pid check)."""

    def __reduce__(self):
        return (_rebuild_fails_in_parent, (os.getpid(), self.args))


def _rebuild_fails_in_parent(worker_pid, args):
    if os.getpid() != worker_pid:
        raise TypeError("cannot rebuild FailsInParent here")
    return FailsInParent(*args)


def raise_fails_in_parent():
    raise FailsInParent("only the worker can read me")


def return_lambda():
    return lambda: 42


def reply_then_die(value):
    """Send this task's own reply, then die: the reply must win over the death."""
    from pool._wire import frames as _frames
    from pool._worker import main as _worker
    _frames.write_frame(_worker._reply_fd, _frames.Kind.RESULT, _worker._current_task_id,
                      pickle.dumps(value))
    os._exit(0)


def write_garbage():
    from pool._worker import main as _worker
    os.write(_worker._reply_fd, b"this is not a frame at all, not even close")
    time.sleep(30)


def write_partial_then_hang(pid_file):
    """Half a reply frame, then silence: the dispatcher must not block reading it."""
    from pool._wire import frames as _frames
    from pool._worker import main as _worker
    header = _frames.HEADER.pack(_frames.MAGIC, _frames.Kind.RESULT, _worker._current_task_id, 1000)
    os.write(_worker._reply_fd, header + b"x" * 10)
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    time.sleep(60)


def init_fails():
    raise RuntimeError("initializer says no")


def init_sets(value):
    global _INIT_VALUE
    _INIT_VALUE = value


_INIT_VALUE = None


def read_init_value(_=None):
    return _INIT_VALUE


def apply_init_value(x):
    """Call what the initializer stored (a function that travelled by value)."""
    return _INIT_VALUE(x)


def random_fate(seed):
    """Deterministic per seed: mostly work, sometimes a death of one kind or another."""
    import random
    rng = random.Random(seed)
    roll = rng.random()
    if roll < 0.01:
        sigkill_self()
    elif roll < 0.015:
        segfault()
    elif roll < 0.02:
        exit_hard(5)
    elif roll < 0.03:
        raise ValueError(seed)
    return seed, os.getpid()


def fate_of(seed):
    import random
    roll = random.Random(seed).random()
    if roll < 0.02:
        return "dies"
    if roll < 0.03:
        return "raises"
    return "ok"


def append_then_fail(path):
    with open(path, "a") as f:
        f.write("start\n")
    raise RuntimeError("initializer says no")


def fail_first_time(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first start fails")


def succeed_first_time(marker):
    """An initializer that lets the first worker start and fails in every later one."""
    if os.path.exists(marker):
        raise RuntimeError("only the first start succeeds")
    open(marker, "w").close()


def announce_then_wait(pid_dir, gate, value=None):
    """Write this worker's pid into ``pid_dir``, then block until ``gate`` exists."""
    path = os.path.join(pid_dir, str(os.getpid()))
    with open(path + ".tmp", "w"):
        pass
    os.rename(path + ".tmp", path)
    return wait_for_file(gate, value, timeout=60)


def announced_pids(pid_dir):
    return {int(name) for name in os.listdir(pid_dir) if name.isdigit()}


class CountsPickling:
    """A callable that counts, in the process that pickles it, how often it was pickled."""

    pickled = 0

    def __call__(self, x):
        return x + 1

    def __reduce__(self):
        type(self).pickled += 1
        return (CountsPickling, ())


def make_bytes(size):
    return bytes(range(256)) * (size // 256)


def byte_sum(data):
    return len(data), sum(data[::4096])


def write_corrupt_raised_frame():
    """A well-formed header with a body that is not the pool's envelope."""
    from pool._wire import frames as _frames
    from pool._worker import main as _worker
    body = b"\x80\x05not a pickle at all"
    os.write(_worker._reply_fd, _frames.HEADER.pack(_frames.MAGIC, _frames.Kind.RAISED,
                                                  _worker._current_task_id, len(body)) + body)
    time.sleep(30)


def use_inner_pool(method, pid_dir=None, gate=None):
    """A task that runs a pool of its own (libraries do); optionally blocks inside it."""
    import multiprocessing
    import pool
    with pool.ProcessPool(2, mp_context=multiprocessing.get_context(method)) as inner:
        if gate is None:
            return sorted(inner.map(square, range(5)))
        busy = [inner.submit(announce_then_wait, pid_dir, gate) for _ in range(2)]
        return [f.result() for f in busy]


# --- lifecycle: timeouts, stopping, terminating, process trees ----------------------------

def stuck_in_c_holding_the_gil(pid_dir=None):
    """A regular expression that backtracks for hours; re never releases the GIL."""
    import re
    if pid_dir:
        announce(pid_dir)
    return re.match(r"(a+)+$", "a" * 48 + "b")


def announce(pid_dir):
    """Make this worker's pid known to the test (a file per pid, written atomically)."""
    path = os.path.join(pid_dir, str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def start_subprocess_then_hang(pid_dir, ignore_sigterm=False):
    """Start a grandchild (``sleep``) in this worker's process group, announce both pids
    (the grandchild's in pid_dir/children), then hang."""
    import subprocess
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "1000"])
    os.makedirs(os.path.join(pid_dir, "children"), exist_ok=True)
    with open(os.path.join(pid_dir, "children", str(child.pid)), "w") as f:
        f.write(str(child.pid))
    announce(pid_dir)
    while True:
        time.sleep(60)


def ignore_sigterm_then_hang(pid_dir):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    announce(pid_dir)
    while True:
        time.sleep(60)


def hang(pid_dir=None):
    if pid_dir:
        announce(pid_dir)
    while True:
        time.sleep(60)


def allocate_and_keep(megabytes):
    """Grow this worker's resident memory by ``megabytes`` and keep it; return the pid."""
    global _kept
    _kept = bytearray(megabytes * 1024 * 1024)
    for i in range(0, len(_kept), 4096):
        _kept[i] = 1
    return os.getpid()


_kept = None


def start_subprocess_then_return(pid_dir):
    """Leave a grandchild (``sleep``) running in this worker's group, and return."""
    import subprocess
    child = subprocess.Popen(["sleep", "1000"])
    os.makedirs(os.path.join(pid_dir, "children"), exist_ok=True)
    with open(os.path.join(pid_dir, "children", str(child.pid)), "w") as f:
        f.write(str(child.pid))
    announce(pid_dir)
    return child.pid


def run_once(directory, i, seconds=0.0):
    """Mark task ``i`` as run (failing if it already was), sleep, return ``i``."""
    os.close(os.open(os.path.join(directory, str(i)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    if seconds:
        time.sleep(seconds)
    return i


class Weakrefable:
    """A result or argument whose lifetime a test watches with a weak reference."""


def make_weakrefable(_):
    return Weakrefable()


# -- initargs that travel by inheritance (multiprocessing's locks, queues, shared memory) --

_inherited: dict[str, object] = {}


def init_inherited(**objects):
    """An initializer that keeps what it was given, for ``use_inherited`` to exercise."""
    _inherited.clear()
    _inherited.update(objects)


def use_inherited():
    """Use every object the initializer was given, as a worker really would."""
    o = _inherited
    for name in ("lock", "rlock", "semaphore", "bounded_semaphore"):
        assert o[name].acquire(timeout=10), name
        o[name].release()
    assert o["event"].is_set()
    with o["condition"]:
        o["condition"].notify_all()
    pid = os.getpid()
    o["queue"].put(("queue", pid))
    o["simple_queue"].put(("simple_queue", pid))
    o["joinable_queue"].put(("joinable_queue", pid))
    with o["value"].get_lock():
        o["value"].value += 1
    with o["array"].get_lock():
        o["array"][0] += 1
    o["manager_dict"][pid] = "seen"
    o["shared_memory"].buf[0] += 1
    return pid


def flush_inherited():
    """Close the queues ``use_inherited`` wrote to and wait for their feeder threads to
    end: a queue's feeder holds a lock shared with every process while it writes, and a
    worker that exits in the middle leaves it taken for every later writer (bpo-22393)."""
    for name in ("queue", "joinable_queue"):
        _inherited[name].close()
        _inherited[name].join_thread()


def init_fails_logging_to(log_queue):
    """Fails, after routing this worker's ``concurrent.futures`` log to ``log_queue`` (as
    CPython's own test does)."""
    import logging
    from logging.handlers import QueueHandler
    logger = logging.getLogger("concurrent.futures")
    logger.addHandler(QueueHandler(log_queue))
    logger.propagate = False
    raise ValueError("error in initializer")


def init_fails_with(_):
    raise RuntimeError("initializer says no")


def value_and_pid(x):
    """``(x, the worker's pid)``: what ran, and where."""
    return x, os.getpid()


def sleep_then_touch(seconds, path):
    """Sleep, then create ``path``: proof that the task ran to its end."""
    time.sleep(seconds)
    open(path, "w").close()


# -- asyncio: which inputs started, where, and what each then does -------------------------

def started_then(directory, i, then="return"):
    """Record that input ``i`` started (a file ``started-<i>`` holding this worker's pid),
    then: "return" ``i``; "wait" until ``directory/gate`` exists, then return ``i``;
    "raise" ValueError(i); or one of EFFECTS ("sigkill", "segfault", ...)."""
    path = os.path.join(directory, f"started-{i}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    if then == "wait":
        wait_for_file(os.path.join(directory, "gate"), timeout=60)
    elif then == "raise":
        raise ValueError(i)
    elif then != "return":
        EFFECTS[then]()
    return i


def started_inputs(directory):
    """{input: worker pid} of the inputs ``started_then`` was called with."""
    started = {}
    for name in os.listdir(directory):
        if name.startswith("started-") and not name.endswith(".tmp"):
            with open(os.path.join(directory, name)) as f:
                started[int(name[len("started-"):])] = int(f.read())
    return started


def log_warning(message):
    import logging
    logging.getLogger("tests.tasks").warning(message)


def print_then_die(text):
    print(text)  # (no flush: an unbuffered stream has written it already)
    os.kill(os.getpid(), signal.SIGKILL)


def write_to_reply_pipe(data, then="return"):
    """Write ``data`` into this worker's reply pipe, as a task that scribbles on the pool's
    wire would (a fake worker: any bytes, a frame of its own making), then "return" "done"
    or "exit" (os._exit(0): the bytes are the last the parent gets)."""
    from pool._worker import main as _worker
    view = memoryview(data)
    while view:
        view = view[os.write(_worker._reply_fd, view):]
    if then == "exit":
        os._exit(0)
    return "done"


def current_task_id():
    from pool._worker import main as _worker
    return _worker._current_task_id


def slow_echo(x):
    """An input of ``python -m pool map`` that takes a while (the shake's)."""
    time.sleep(0.05)
    return x


def open_file(path):
    return open(path)  # noqa: SIM115 (returned on purpose: it cannot travel)


# Opens under /proc in this process, seen by an audit hook (test_platform): (pid, path), so
# that a forked worker tells its own from those it inherited.
_proc_opened: list[tuple[int, str]] = []
_watching_proc = False
_test_reads_proc = False  # the test's own reads, not noted


def _note_proc(event, args):
    if _test_reads_proc:
        return
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(
            args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path == "/proc" or path.startswith("/proc/"):
            _proc_opened.append((os.getpid(), path))


def watch_proc_opens():
    """Note every open (or listing) under /proc in this process from now on. Also an
    initializer: under fork the worker already has its parent's hook."""
    global _watching_proc
    if not _watching_proc:
        import sys
        sys.addaudithook(_note_proc)
        _watching_proc = True


def proc_opens():
    return [path for pid, path in _proc_opened if pid == os.getpid()]


def is_stopped(pid):
    """Whether the kernel shows ``pid`` stopped (the test's own read of /proc, not noted)."""
    global _test_reads_proc
    _test_reads_proc = True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    finally:
        _test_reads_proc = False
    return text[text.rindex(")") + 2] in "Tt"


def platform_facts(_=None):
    """What a worker's ``pool._platform`` says, and what it opened under /proc."""
    from pool import _platform
    flags = ("PORTABLE", "PACKET_PIPES", "PIPE_RESIZE", "PROC", "UNREAD_ON_WRITE_END",
             "MEMFD", "SHARED_MEMORY", "CPU_AFFINITY", "POLL_READER_GONE")
    return {"pid": os.getpid(), "flags": {name: getattr(_platform, name) for name in flags},
            "proc_opens": proc_opens()}


def square_unless(x, fail=(7,), die=()):
    """x * x, but ValueError for the items in ``fail`` and a SIGKILL of the worker for
    those in ``die`` (pool.Pool's tests)."""
    if x in die:
        os.kill(os.getpid(), signal.SIGKILL)
    if x in fail:
        raise ValueError(f"{x} fails")
    return x * x


def mark_then(directory, x, die=()):
    """Leave ``directory/x`` to say that x ran, then as square_unless with ``die``."""
    open(os.path.join(directory, str(x)), "a").close()
    return square_unless(x, fail=(), die=die)


def return_lock(_=None):
    """A value no pickler can send back: a lock."""
    import threading
    return threading.Lock()


def counted_input(counter_path, count=None):
    """0, 1, 2, ... for ever (or ``count`` of them), writing how many were read so far to
    ``counter_path`` (pool.Pool's imap tests: how far ahead the input is read)."""
    import itertools
    for n in itertools.count() if count is None else range(count):
        with open(counter_path + ".tmp", "w") as f:
            f.write(str(n + 1))
        os.rename(counter_path + ".tmp", counter_path)  # whole, for a reader at any moment
        yield n


def gated_square(gate, x):
    """x * x once ``gate`` exists."""
    wait_for_file(gate)
    return x * x


# -- pool.Pool's chunks: each item's runs counted, and what it then does -------------------

def counted_then(directory, effects, x):
    """Add a byte to ``directory/x`` (how many times x ran), then do what ``effects`` says
    for x: "sigkill", "segfault", "exit" (code 7), "exit0", "sleep" (60 s), "raise",
    "local" (return a value
    only cloudpickle can send), "dies-sending" (a value that kills its worker when the
    reply is pickled); else return x * x."""
    with open(os.path.join(directory, str(x)), "a") as marks:
        marks.write("x")
    effect = effects.get(x)
    if effect == "sigkill":
        sigkill_self()
    elif effect == "segfault":
        segfault()
    elif effect == "exit":
        exit_hard(7)
    elif effect == "exit0":
        exit_hard(0)
    elif effect == "sleep":
        time.sleep(60)
    elif effect == "raise":
        raise ValueError(f"{x} fails")
    elif effect == "local":
        return lambda: x
    elif effect == "dies-sending":
        return DiesSending(x)
    return x * x


def items_or_died(iterator, count):
    """The next ``count`` items of a pool.Pool imap, "died" for each that raised
    WorkerDied (the iteration goes on after it)."""
    import pool
    got = []
    for _ in range(count):
        try:
            got.append(next(iterator))
        except pool.WorkerDied:
            got.append("died")
    return got


def runs_of(directory):
    """How many times each item of ``counted_then`` ran."""
    return {int(name): len(open(os.path.join(directory, name)).read())
            for name in os.listdir(directory)}


class DiesSending:
    """Pickles once (a chunk's record of it), then SIGKILLs its process at the second
    pickling: the reply. Unpickles as a plain DiesSending."""

    def __init__(self, x, pickled=0):
        self.x = x
        self.pickled = pickled

    def __reduce__(self):
        self.pickled += 1
        if self.pickled == 2 and multiprocessing.parent_process() is not None:
            sigkill_self()
        return DiesSending, (self.x, 99)


def nested_pool_then(directory, x):
    """Runs a chunk on a pool.Pool of its own (forked from this worker), then, for x == 0,
    SIGKILLs this worker: the inner pool's record must not stand for this one's."""
    import pool
    with open(os.path.join(directory, str(x)), "a") as marks:
        marks.write("x")
    if x == 0:
        with pool.Pool(1, context=multiprocessing.get_context("fork")) as inner:
            inner.map(square, [10, 11, 12, 13], chunksize=4)
        sigkill_self()
    return ("outer", x)


def start_then_sleep(directory, x):
    """Say that x started (``directory/started-x``), then sleep a minute."""
    open(os.path.join(directory, f"started-{x}"), "w").close()
    time.sleep(60)


# --- large payloads (tests/test_segments.py) ---------------------------------------------

class Blob:
    """A buffer that pickles as protocol 5 out-of-band data, as a numpy array does: it
    arrives as a view of what the unpickler was given, without a copy."""

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return Blob, (pickle.PickleBuffer(self.data),)
        return Blob, (bytes(self.data),)


def make_text(size):
    return "x" * size


def blob(size, fill=1):
    return Blob(bytearray([fill]) * size)


def blob_facts(b):
    """What a Blob arrived as: the type of the object behind its memory, its size, and
    a checksum."""
    view = memoryview(b.data)
    return type(view.obj).__name__, view.nbytes, checksum(view)


def checksum(data):
    import zlib
    return zlib.crc32(data)


def payload_facts(value):
    """The type and checksum of a bytes or bytearray argument."""
    return type(value).__name__, len(value), checksum(value)


_kept = []


def keep_blob(b):
    """Keep the argument's view in a global: its segment must never be written again."""
    _kept.append(b)
    return checksum(memoryview(b.data))


def kept_checksums():
    return [checksum(memoryview(b.data)) for b in _kept]


def blob_then_die(size):
    """Send a large result (through the worker's loan, if it has one), then die."""
    from pool._wire import frames as _frames, pickling as _pickling
    from pool._worker import main as _worker
    kind, body = _pickling.encode_result(blob(size, 7))
    _frames.write_frame(_worker._reply_fd, kind, _worker._current_task_id, body)
    os.kill(os.getpid(), signal.SIGKILL)


def die_holding(b):
    os.kill(os.getpid(), signal.SIGKILL)


def write_bad_segment_result():
    """A RESULT frame that says its payloads are in a segment, with an envelope that
    points past the segment's end."""
    import struct
    from pool._wire import frames as _frames, payloads as _payloads
    from pool._worker import main as _worker
    envelope = struct.pack("!IIQQI", 0, 99999, 1, 1, 1) + struct.pack("!QQB", 1 << 40, 64, 0)
    _frames.write_frame(_worker._reply_fd, _frames.Kind.RESULT, _worker._current_task_id,
                        _payloads.MARKER + envelope + pickle.dumps(None))
    time.sleep(30)


def fork_viewing(b, gate, path, escape=False):
    """Fork a child that checks its view of the argument once ``gate`` exists (after the
    task has ended and the parent has sent more calls), writing "same" or "changed" to
    ``path``; return at once. With ``escape``, the child leaves the worker's process group
    (as a daemon does), so that ending the worker's group does not end it."""
    expected = checksum(memoryview(b.data))
    if os.fork() == 0:
        try:
            if escape:
                os.setsid()
            wait_for_file(gate, timeout=60)
            same = checksum(memoryview(b.data)) == expected
            with open(path + ".tmp", "w") as f:
                f.write("same" if same else "changed")
            os.replace(path + ".tmp", path)
        finally:
            os._exit(0)
    return expected


def write_sparse_segment_result(size):
    """A RESULT frame whose envelope points at ``size`` bytes of the lent segment that
    were never written (the segment only grown to hold them)."""
    from pool._wire import frames as _frames, loans as _loans, payloads as _payloads
    from pool._worker import main as _worker
    desk = _loans.worker_desk
    generation, fd, ino = desk.loan()
    target = os.open(f"/proc/{desk.parent_pid}/fd/{fd}", os.O_RDWR)
    os.ftruncate(target, size)
    os.close(target)
    envelope = _payloads.envelope(0, fd, ino, generation, [(_Sized(size), 0)], [0])
    _frames.write_frame(_worker._reply_fd, _frames.Kind.RESULT, _worker._current_task_id,
                        _payloads.MARKER + envelope + pickle.dumps(None))
    time.sleep(30)


class _Sized:
    """Stands for a payload of ``nbytes`` in an envelope, without its bytes."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def same_object(pair):
    return pair[0] is pair[1], pair


def fork_viewing_then_hang(b, gate, path):
    """fork_viewing (its child escaping the group), then hang: the task's timeout kills the
    worker and its group before it replies."""
    fork_viewing(b, gate, path, escape=True)
    time.sleep(60)

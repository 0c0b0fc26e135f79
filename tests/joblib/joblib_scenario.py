# The top of every scenario script of tests/joblib (a child interpreter). Its functions
# are the calls the scenarios make: a worker imports the script as __mp_main__.
import json, os, signal, sys, time, threading, multiprocessing  # noqa: F401 (for scenarios)
sys.path[:0] = [os.environ["POOL_TESTS_DIR"]]
import helpers
import pool, pool.joblib  # noqa: F401 (registers the backend)
from joblib import Parallel, delayed, parallel_config  # noqa: F401 (for scenarios)

METHOD = os.environ.get("POOL_TEST_START_METHOD", "forkserver")


def report(**facts):
    print("REPORT " + json.dumps(facts), flush=True)


def hold_memory(mib):
    """Keeps ``mib`` MiB resident in this worker (in a module that does not travel with the
    function), returns its pid."""
    sys.__dict__.setdefault("held_by_test", []).append(b"\x01" * (mib << 20))
    return os.getpid()


def square(x):
    return x * x


def pid_of(_=None):
    return os.getpid()


def parent_of(_=None):
    return os.getppid()


def segfault_at(x, bad):
    if x == bad:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x


def segfault_when(path):
    """Dies once ``path`` exists."""
    wait_for_file(path, 60)
    os.kill(os.getpid(), signal.SIGSEGV)


def fail_when(path):
    """Raises once ``path`` exists."""
    wait_for_file(path, 60)
    raise ValueError("the other call is running")


def fail_at(x, bad):
    if x == bad:
        raise ValueError(f"call {x} failed")
    return x


def sleep_then(seconds, value=None):
    time.sleep(seconds)
    return value


def mark(directory, name):
    """Writes a file named ``name`` holding this process's pid (a call began), returns it."""
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    return os.getpid()


def mark_then_sleep(directory, name, seconds):
    mark(directory, name)
    time.sleep(seconds)
    return name


def wait_for_file(path, timeout=30):
    return helpers.wait_until(lambda: os.path.exists(path), timeout)


def pid_in(directory, name):
    with open(os.path.join(directory, name)) as f:
        return int(f.read())


def nested(n):
    """A Parallel call inside a task: which backend runs it, and in which processes."""
    from joblib.parallel import get_active_backend
    backend, _ = get_active_backend()
    pids = Parallel(n_jobs=2)(delayed(pid_of)() for _ in range(n))
    return type(backend).__name__, sorted(set(pids)), os.getpid()


def nesting_below():
    """In a call of a nested Parallel: the backend a Parallel nested in it in turn gets."""
    from joblib.parallel import get_active_backend
    return type(get_active_backend()[0]).__name__


def nested_twice(_=None):
    return Parallel(n_jobs=2)(delayed(nesting_below)() for _ in range(2))


def init_counting(directory):
    """An initializer: a file per worker started."""
    mark(directory, f"started{os.getpid()}")


def init_failing_unless(path):
    if not os.path.exists(path):
        raise RuntimeError("not yet")


def thread_settings(_=None):
    import numpy  # noqa: F401 (its BLAS loaded, for threadpoolctl to see)
    from threadpoolctl import threadpool_info
    return (os.environ.get("OMP_NUM_THREADS"),
            sorted({info["num_threads"] for info in threadpool_info()}))

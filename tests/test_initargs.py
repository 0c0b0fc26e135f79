"""initializer/initargs with multiprocessing's own objects: they travel by inheritance, as
with the stdlib, under every start method, to every worker including those started later
to refill a slot; what cannot travel fails in the constructor."""

from __future__ import annotations

import gc
import pickle
import sys
import threading
import weakref
from multiprocessing import shared_memory

import multiprocessing
import pytest

import pool
import tasks


# Value and Array come from multiprocessing's process-wide heap, whose first allocation maps
# an arena that stays open for the life of the process: map it before any test's
# descriptor count starts, so that it is not counted as a leak.
_HEAP_IN_USE = multiprocessing.Value("i", 0)


@pytest.fixture
def inherited(ctx):
    """One of each object the stdlib lets a pool's workers share through ``initargs``."""
    manager = ctx.Manager()
    memory = shared_memory.SharedMemory(create=True, size=8)
    memory.buf[0] = 0
    objects = dict(lock=ctx.Lock(), rlock=ctx.RLock(), semaphore=ctx.Semaphore(1),
                   bounded_semaphore=ctx.BoundedSemaphore(1), event=ctx.Event(),
                   condition=ctx.Condition(), queue=ctx.Queue(), simple_queue=ctx.SimpleQueue(),
                   joinable_queue=ctx.JoinableQueue(), value=ctx.Value("i", 0),
                   array=ctx.Array("i", 4), manager_dict=manager.dict(), shared_memory=memory)
    objects["event"].set()
    yield objects
    for name in ("queue", "joinable_queue"):
        objects[name].close()
        objects[name].join_thread()
    objects["simple_queue"].close()
    memory.close()
    memory.unlink()
    manager.shutdown()
    objects.clear()  # pipes of unused queue ends and proxies' connections close when freed
    gc.collect()


def _check_one_use(objects, pid):
    for name in ("queue", "simple_queue", "joinable_queue"):
        got = objects[name].get(timeout=30) if name != "simple_queue" else objects[name].get()
        assert got == (name, pid)


def test_multiprocessing_objects_in_initargs_reach_every_worker(ctx, inherited):
    # Positional initargs, as the stdlib passes them: initializer(*initargs).
    with pool.ProcessPool(1, mp_context=ctx, initializer=_call_with_names,
                          initargs=(tasks.init_inherited, tuple(inherited),
                                    *inherited.values())) as p:
        first = p.submit(tasks.use_inherited).result(timeout=60)
        _check_one_use(inherited, first)
        # The worker dies (once its queues' feeder threads let go of the queues' shared
        # locks: not the subject here); the slot's new worker gets the same objects.
        p.submit(tasks.flush_inherited).result(timeout=60)
        with pytest.raises(pool.WorkerDied):
            p.submit(tasks.do_effect, "exit").result(timeout=60)
        second = p.submit(tasks.use_inherited).result(timeout=60)
        assert second != first
        _check_one_use(inherited, second)
    assert inherited["value"].value == 2 and inherited["array"][0] == 2
    assert inherited["shared_memory"].buf[0] == 2
    assert set(inherited["manager_dict"].keys()) == {first, second}


def _call_with_names(init, names, *objects):
    init(**dict(zip(names, objects)))


def test_initargs_that_cannot_travel_fail_in_the_constructor(ctx):
    if ctx.get_start_method() == "fork":  # nothing is pickled: the stdlib accepts it too
        with pool.ProcessPool(1, mp_context=ctx, initializer=tasks.init_sets,
                              initargs=(threading.Lock(),)) as p:
            assert p.submit(tasks.square, 3).result(timeout=30) == 9
        return
    with pytest.raises(pickle.PicklingError, match=r"initargs\[0\] \(a lock\) cannot be sent "
                       f"to workers started by '{ctx.get_start_method()}'.*lock") as info:
        pool.ProcessPool(1, mp_context=ctx, initializer=tasks.init_sets,
                         initargs=(threading.Lock(),))
    assert isinstance(info.value, pool.ArgumentPicklingError)
    assert isinstance(info.value, TypeError)  # what pickling a lock raises


def test_a_lock_from_another_context_fails_saying_which_context_to_use(ctx):
    if ctx.get_start_method() == "fork":
        return
    lock = multiprocessing.get_context("fork").Lock()  # the default context before 3.14
    with pytest.raises(pool.ArgumentPicklingError, match="fork context.*Create it from the "
                       f"pool's context: multiprocessing.get_context\\('{ctx.get_start_method()}'"):
        pool.ProcessPool(1, mp_context=ctx, initializer=tasks.init_sets, initargs=(lock,))


def test_initargs_only_cloudpickle_can_send_travel_by_value(ctx):
    offset = 40
    with pool.ProcessPool(1, mp_context=ctx, initializer=tasks.init_sets,
                          initargs=(lambda x: x + offset,)) as p:
        assert p.submit(tasks.apply_init_value, 2).result(timeout=30) == 42


def test_a_failing_initializer_is_logged_in_the_worker_and_breaks_the_pool(ctx):
    log_queue = ctx.Queue()
    p = pool.ProcessPool(1, mp_context=ctx, initializer=tasks.init_fails_logging_to,
                         initargs=(log_queue,))
    try:
        assert p._broken is False
        with pytest.raises(pool.InitializerError):  # a BrokenExecutor, as in the stdlib
            p.submit(tasks.square, 2).result(timeout=60)
        assert "failed to start" in p._broken
        with pytest.raises(pool.InitializerError):
            p.submit(tasks.square, 2)
        record = log_queue.get(timeout=30)
        assert record.getMessage().startswith("Exception in initializer:")
        assert "ValueError: error in initializer" in record.getMessage()
    finally:
        p.shutdown()
        log_queue.close()
        del log_queue, p  # its write end closes when it is freed (the pool keeps initargs)
        gc.collect()


@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="on 3.12 a decoded exception's "
                    "frames still lead to the dispatcher's loop (see exceptions._loads_detached)")
def test_a_pool_whose_initializer_failed_is_freed_without_the_gc():
    # The initializer's exception, rebuilt by tblib, must not lead back to the dispatcher
    # that keeps it: that cycle kept initargs (CPython's test: a Queue's semaphores) alive
    # until a garbage collection.
    argument = tasks.Weakrefable()
    ref = weakref.ref(argument)
    gc.disable()
    try:
        p = pool.ProcessPool(1, mp_context=multiprocessing.get_context("fork"),
                             initializer=tasks.init_fails_with, initargs=(argument,))
        with pytest.raises(pool.InitializerError):
            p.submit(tasks.square, 1).result(timeout=60)
        p.shutdown()
        del p, argument
        assert ref() is None
    finally:
        gc.enable()

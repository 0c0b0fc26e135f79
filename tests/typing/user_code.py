"""User code as a typed program would write it; ``mypy --strict`` must accept it and infer
the types asserted here (run by tox's typecheck environment, not by pytest)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from typing import Any, AsyncGenerator, Iterator, assert_type

import pool


def work(x: int, label: str = "") -> tuple[int, str]:
    return x * 2, label


async def main(executor: pool.ProcessPool) -> int:
    doubled, _ = await executor.submit(work, 21, label="a")  # awaitable, typed
    assert_type(doubled, int)
    assert_type(await executor.run(work, 1, label="b", timeout=2.0), tuple[int, str])
    results = executor.amap(work, [1, 2], buffersize=2, ordered=False, chunksize=1)
    assert_type(results, AsyncGenerator[tuple[int, str], None])
    async for result in results:
        assert_type(result, tuple[int, str])
    await results.aclose()
    assert_type(await pool.to_process(work, 3, label="c"), tuple[int, str])
    future = executor.submit(work, 4)
    plain: cf.Future[str] = cf.Future()
    async for done in pool.as_completed_async([future]):
        assert_type(done, pool.PoolFuture[tuple[int, str]])  # stop() is there
    mixed: list[cf.Future[Any]] = [future, plain]  # as with cf.as_completed
    async for either in pool.as_completed_async(mixed):
        assert_type(either, cf.Future[Any])
    return doubled


def typed_use() -> None:
    with pool.ProcessPoolExecutor(2) as executor:
        future = executor.submit(work, 1, "x")
        assert_type(future, pool.PoolFuture[tuple[int, str]])
        assert_type(future.result(), tuple[int, str])
        assert_type(future.stop(), bool)
        assert_type(executor.schedule(work, (1,), timeout=5.0), pool.PoolFuture[tuple[int, str]])
        results = executor.map(work, [1, 2], chunksize=2, buffersize=4)
        assert_type(results, Iterator[tuple[int, str]])
        assert_type(asyncio.run(main(executor)), int)
        for done in cf.as_completed([future]):
            assert_type(done, cf.Future[tuple[int, str]])
        stats = executor.stats()
        assert_type(stats, pool.PoolStats)
        assert_type(stats.completed, int)
        for worker in stats.workers:
            assert_type(worker, pool.WorkerStats)
            assert_type(worker.rss, int | None)
            assert_type(worker.current_task, pool.TaskInfo | None)
        seen: list[int] = []
        counted = executor.map(work, [1, 2], chunksize=2, progress=seen.append)
        assert_type(counted, Iterator[tuple[int, str]])
        for finished in pool.as_completed([future], timeout=5.0, progress=Bar()):
            assert_type(finished, pool.PoolFuture[tuple[int, str]])
            assert_type(finished.stop(), bool)  # a pool's future keeps its own API
        idle = pool.ProcessPool(2, idle_timeout=30.0)
        idle.shutdown()
        base: cf.Executor = executor  # still a concurrent.futures.Executor
        assert_type(base.submit(work, 3), cf.Future[tuple[int, str]])
        for any_future in pool.as_completed([base.submit(work, 4)]):
            assert_type(any_future, cf.Future[tuple[int, str]])
        executor.shutdown(wait=True, cancel_futures=False)
    assert_type(pool.__version__, str)


async def with_a_lease() -> int:
    async with pool.shared() as lease:
        doubled, _ = await lease.submit(work, 21)
    return doubled


def shared_use() -> None:
    with pool.shared(max_workers=2, task_timeout=None) as lease:
        assert_type(lease, pool.Lease)
        future = lease.submit(work, 1, "x")
        assert_type(future, pool.PoolFuture[tuple[int, str]])
        assert_type(lease.schedule(work, (1,), timeout=5.0), pool.PoolFuture[tuple[int, str]])
        assert_type(lease.map(work, [1, 2], buffersize=2), Iterator[tuple[int, str]])
        assert_type(lease.options, dict[str, Any])
        base: cf.Executor = lease
        assert_type(base.submit(work, 3), cf.Future[tuple[int, str]])
        lease.shutdown(wait=True, cancel_futures=False)
    assert_type(asyncio.run(with_a_lease()), int)
    try:
        pool.shared(max_workers=3).shutdown()
    except pool.SharedPoolConflict as conflict:
        assert_type(conflict.differing, dict[str, tuple[str, str]])


def dask_use() -> None:
    from distributed import WorkerPlugin
    from pool.dask import ProcessPoolPlugin
    plugin = ProcessPoolPlugin("processes", max_workers=2, task_timeout=60.0,
                               start_method="spawn", initializer=print, initargs=("x",))
    assert_type(plugin.name, str)
    base: WorkerPlugin = plugin
    ProcessPoolPlugin(max_workers="2")  # type: ignore[arg-type]
    ProcessPoolPlugin(timeout=3)  # type: ignore[call-arg]


class Bar:
    """What tqdm offers, as far as progress= needs it."""

    def update(self, n: int = 1) -> bool | None:
        return None


def rejected(executor: pool.ProcessPool) -> None:
    executor.map(work, [1], progress=42)  # type: ignore[arg-type]
    executor.submit(work, "not an int")  # type: ignore[arg-type]
    executor.submit(work, 1, label=2)  # type: ignore[arg-type]
    pool.shared(max_worker=2)  # type: ignore[call-arg]
    pool.shared(max_workers="2")  # type: ignore[arg-type]
    pool.shared().submit(work, "not an int")  # type: ignore[arg-type]
    pool.to_process(work, "not an int")  # type: ignore[arg-type,unused-coroutine]


def patched() -> None:
    import concurrent.futures
    patch = pool.patch()
    assert_type(patch, pool.Patch)
    with pool.patch() as inner:
        assert_type(inner, pool.Patch)
        executor = concurrent.futures.ProcessPoolExecutor(2)
        executor.shutdown()
    patch.undo()
    patch.undo(True)  # type: ignore[call-arg]


Pair = tuple[int, str]


def mp_pool_face() -> None:
    """pool.Pool: results typed as multiprocessing.pool's are, from the function."""
    with pool.Pool(2, task_timeout=10) as p:
        assert_type(p.apply(work, (1,)), Pair)
        result = p.apply_async(work, (1,), callback=lambda pair: None)
        assert_type(result, pool.AsyncResult[Pair])
        assert_type(result.get(1.0), Pair)
        assert_type(p.map(work, [1, 2]), list[Pair])
        mapped = p.map_async(work, [1, 2])
        assert_type(mapped, pool.MapResult[Pair])
        assert_type(mapped.get(), list[Pair])
        assert_type(p.starmap(work, [(1,)]), list[Pair])
        for pair in p.imap(work, [1, 2], chunksize=2):
            assert_type(pair, Pair)
        iterator = p.imap_unordered(work, [1])
        assert_type(iterator, pool.IMapIterator[Pair])
        assert_type(iterator.next(timeout=1.0), Pair)
        p.close()
        p.join()
    p.apply(work, 1)  # type: ignore[arg-type]

"""The wakeup handle (``pool._dispatcher.wakeup``): never lost, and never stuck on its own lock."""

from __future__ import annotations

import select
import threading

from pool._dispatcher.wakeup import Wakeup


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_one_byte_however_many_wakes_and_none_lost_after_a_drain():
    wakeup = Wakeup()
    try:
        for _ in range(100):
            wakeup.wake()
        assert readable(wakeup.reader)
        wakeup.drain()
        assert not readable(wakeup.reader)
        wakeup.wake()  # after the drain: it is heard
        assert readable(wakeup.reader)
    finally:
        wakeup.close()


def test_a_lock_left_held_by_an_interrupted_caller_blocks_nothing():
    # A Ctrl-C that lands between taking the lock and the code that gives it back leaves
    # it held for good (CPython bpo-29988). The exit's shutdown() then
    # wakes the loop too, and the loop drains and closes: none of them may wait for it.
    wakeup = Wakeup()
    wakeup._lock.acquire()  # (as the interrupted caller left it)
    done = threading.Event()

    def others() -> None:
        wakeup.wake()
        wakeup.wake()
        done.set()
    thread = threading.Thread(target=others)
    thread.start()
    assert done.wait(5)
    thread.join()
    assert readable(wakeup.reader)  # the wakes were heard
    wakeup.drain()
    assert not readable(wakeup.reader)
    wakeup.wake()
    assert readable(wakeup.reader)
    wakeup.close()
    wakeup.wake()  # (closed: nothing happens)

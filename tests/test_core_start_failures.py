"""Failed and refused starts, and the back-off after a refusal
(``pool._core.start_failures``, ``pool._core.backoff``)."""

from __future__ import annotations

import pytest

from pool._core.backoff import doubling
from pool._core.start_failures import (MAX_REFUSED_STARTS, MAX_START_FAILURES,
                                       START_RETRY_FIRST_SECONDS, START_RETRY_MAX_SECONDS,
                                       StartFailures)


def test_failed_starts_in_a_row_break_and_a_completed_task_forgives_them():
    starts = StartFailures()
    for _ in range(MAX_START_FAILURES - 1):
        starts.start_failed()
    assert not starts.too_many_failures
    starts.task_completed()
    for _ in range(MAX_START_FAILURES - 1):
        starts.start_failed()
    assert not starts.too_many_failures
    starts.start_failed()
    assert starts.too_many_failures


def test_refusals_in_one_round_of_starts_count_once_and_set_one_retry_time():
    starts = StartFailures()
    assert not starts.probing and starts.retry_at is None
    starts.start_refused(now=10.0)
    starts.start_refused(now=10.5)  # another slot of the same round
    assert starts.refused == 1 and starts.probing
    assert starts.retry_at == pytest.approx(10.0 + START_RETRY_FIRST_SECONDS)
    starts.retry_due()
    assert starts.retry_at is None and starts.probing  # probing until a worker is READY


def test_the_wait_doubles_with_each_round_refused_up_to_a_most():
    starts = StartFailures()
    waits = []
    for _ in range(20):
        starts.start_refused(now=0.0)
        assert starts.retry_at is not None
        waits.append(starts.retry_at)
        starts.retry_due()
    assert waits[:3] == pytest.approx([START_RETRY_FIRST_SECONDS * k for k in (1, 2, 4)])
    assert max(waits) == waits[-1] == START_RETRY_MAX_SECONDS
    assert starts.too_many_refused and starts.refused == 20 >= MAX_REFUSED_STARTS


def test_a_worker_that_starts_ends_the_refusals():
    starts = StartFailures()
    for _ in range(MAX_REFUSED_STARTS):
        starts.start_refused(now=0.0)
        starts.retry_due()
    starts.start_refused(now=0.0)
    starts.worker_ready()
    assert starts.refused == 0 and starts.retry_at is None
    assert not starts.probing and not starts.too_many_refused


def test_doubling_starts_at_first_and_never_overflows():
    assert [doubling(1.0, n, 100.0) for n in (1, 2, 3, 8)] == [1.0, 2.0, 4.0, 100.0]
    assert doubling(0.01, 10_000, 2.0) == 2.0

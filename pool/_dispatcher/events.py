"""What a worker's frames say, as events, and what the state machine answers to each.

Owns: the event types (``Replied``, ``Ready``, ``InitFailed``, ``OverMemory``,
``BrokeProtocol``), ``worker_events``, the one place a worker's frames become events, and
``tell``, the one place an event becomes a call on the machine.
Runs in: the dispatcher thread only.
Guarantees:
- events come in the order of their frames; replies that follow each other come as one
  ``Replied``, told to the machine at once (replies are the hot path);
- a frame is decoded only once the event before it has been taken, so nothing that follows
  a frame that got the worker called misbehaving is decoded: decoding runs the reducers of
  what the worker sent;
- a frame whose body is not what its kind says, and bytes that are not a frame, become
  ``BrokeProtocol`` with the reason, after the replies that came before them;
- every exception decoded here is added to the caller's list, so that the frames that
  unpickled it can be released once they have returned (``exceptions.release_frames``).
Assumes: the caller stops taking events from a worker the machine calls misbehaving.
"""

from __future__ import annotations

import logging
from .._core.values import value_type
from typing import Iterator, Union

from .._core.actions import Action, Resolve
from .._core.machine import StateMachine
from .._wire.frames import Frame, Kind, MalformedFrame
from .._wire.exceptions import decode_exception
from .._wire.pickling import decode_outcome
from .._worker.handle import WorkerHandle

logger = logging.getLogger("pool")


@value_type()  # not frozen, as ``Send``: one is made for every read of replies
class Replied:
    """Replies, in the order they came: ``(task_id, (True, value) or (False, error))``."""
    replies: list[tuple[int, object]]


@value_type(frozen=True)
class Ready:
    """The worker has started, and its initializer succeeded."""


@value_type(frozen=True)
class InitFailed:
    """The worker's initializer raised ``error``; the worker exits next."""
    error: BaseException


@value_type(frozen=True)
class OverMemory:
    """The worker uses ``rss`` bytes, above ``max_memory_per_child``: it is replaced after
    the task whose reply follows."""
    rss: int


@value_type(frozen=True)
class BrokeProtocol:
    """The worker sent what the protocol does not allow (``reason`` says what)."""
    reason: str


WorkerEvent = Union[Replied, Ready, InitFailed, OverMemory, BrokeProtocol]


def worker_events(worker: WorkerHandle, decoded_errors: list[BaseException]
                  ) -> Iterator[WorkerEvent]:
    """The events in what has arrived from ``worker``, decoded as they are taken."""
    replies: list[tuple[int, object]] = []
    for frame in worker.read():
        kind = frame.kind
        if kind is Kind.RESULT or kind is Kind.RAISED:
            try:
                outcome = decode_outcome(frame, worker.desk)
            except MalformedFrame as exc:
                if replies:  # the replies before it count
                    yield Replied(replies)
                    replies = []
                yield _not_a_reply(kind, exc)
                continue
            if not outcome[0]:
                decoded_errors.append(outcome[1])
            replies.append((frame.task_id, outcome))
            continue
        if replies:  # told first, and this frame decoded only if the worker still counts
            yield Replied(replies)
            replies = []
        yield _other_event(frame, decoded_errors)
    if replies:
        yield Replied(replies)
    if worker.reader.error:  # after those frames, bytes that are not a frame
        yield BrokeProtocol(worker.reader.error)


def _other_event(frame: Frame, decoded_errors: list[BaseException]) -> WorkerEvent:
    """The event of a frame that is not a reply."""
    kind = frame.kind
    try:
        if kind is Kind.READY:
            return Ready()
        if kind is Kind.INIT_FAILED:
            error = decode_exception(frame.body)
            decoded_errors.append(error)
            return InitFailed(error)
        if kind is Kind.OVER_MEMORY:
            if len(frame.body) != 8:
                raise MalformedFrame(f"{len(frame.body)} bytes, not 8")
            return OverMemory(int.from_bytes(frame.body, "big"))
        raise MalformedFrame(f"a {kind.name} frame carries no outcome")
    except MalformedFrame as exc:
        return _not_a_reply(kind, exc)


def _not_a_reply(kind: Kind, exc: MalformedFrame) -> BrokeProtocol:
    return BrokeProtocol(f"a {kind.name} frame that is not a reply ({exc})")


def tell(machine: StateMachine, index: int, worker: WorkerHandle, event: WorkerEvent,
         pool_name: str) -> list[Action]:
    """Tell the machine what the worker in slot ``index`` said; its answer."""
    match event:
        case Replied():
            actions = machine.tasks_replied(index, event.replies)
            # Count those it accepted. After a frame out of turn it believes none; such
            # replies were decoded all the same, having come in the same read, and the
            # worker is killed next.
            worker.tasks_run += sum(type(action) is Resolve for action in actions)
            return actions
        case Ready():
            return machine.worker_ready(index, pipelining=worker.reclaim_fd is not None)
        case InitFailed():
            # Kept for the error its exit brings: it failed to start.
            worker.start_error = event.error
            return machine.worker_init_failed(index)
        case OverMemory():
            logger.info("%s: worker pid %d uses %d bytes, above max_memory_per_child; "
                        "replacing it after this task", pool_name, worker.pid, event.rss)
            return machine.worker_over_memory(index)
        case BrokeProtocol():
            return machine.worker_misbehaved(index, event.reason)
    raise AssertionError(f"unknown event {event!r}")

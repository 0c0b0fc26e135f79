"""How much the dispatcher may put into a worker's task pipe without ever blocking: the
pipelining limits in one table, and the rule that relates them.

Owns: the pipelining depth, the size of a frame that may be sent ahead, the least pipe
capacity that packets are queued in, and the size above which a frame is written by a
thread of its own.
Runs in: imported by the dispatcher, the worker handle and the state machine's users;
``check_pipeline`` runs where a dispatcher is made.
Guarantees: the table below obeys the rule (asserted at import), and a depth that would
break it is refused with ``ValueError``.
Assumes: Linux pipe semantics where packet mode exists (``pipes``). Each write of at most
``PIPE_BUF`` bytes into a packet-mode pipe is one packet, and takes one page of the pipe
however short it is.

The rule: the dispatcher writes a frame itself only where the pipe has room for all of it.
So none of its writes can block, whatever the worker does: run user code while it
unpickles, hang, or be stopped.

1. A frame sent ahead, behind the running task, is one packet: header and body at most
   ``PIPELINE_MAX_FRAME`` (``PIPE_BUF``) bytes, in one write.
2. At most ``depth`` packets are in a pipe at once, the running task's and those behind
   it, one page each. So ``depth * PIPE_BUF <= PACKET_PIPE_BYTES``: the least capacity a
   task pipe must have for packets to be queued in it at all. A smaller pipe, for a user
   over ``pipe-user-pages-soft``, gets one task at a time.
3. Any other frame is written only into an empty pipe. The dispatcher writes it if it is at
   most ``background_above(capacity)`` bytes, header included, which is no more than the
   pipe holds. Otherwise a thread of its own writes it.
"""

from __future__ import annotations

from .frames import HEADER
from .pipes import PIPE_BUF

# Small tasks in flight per worker; _core.placement.SHORT_TASK_SECONDS says when more than
# one. A worker then finds its next task in its pipe instead of waiting for a round trip:
# measured, about twice the no-op tasks/s of a depth of 1. Tasks queued behind one that
# runs long are taken back from the pipe after _core.placement.RECLAIM_AFTER_SECONDS and run
# elsewhere, so a task that hangs holds up no other. Where pipes have no packet mode (not
# Linux, or POOL_PORTABLE: _platform.PACKET_PIPES), the depth is 1 whatever this says.
PIPELINE_DEPTH = 8
# Rule 1: the largest frame (header included) that may be sent ahead: one packet.
PIPELINE_MAX_FRAME = PIPE_BUF
# Rule 2: a task pipe smaller than this gets no packets queued behind the running task.
PACKET_PIPE_BYTES = 64 << 10
# Rule 3: frames larger than this, or than the pipe if it is smaller, are written by a
# thread. The worker may stop reading in the middle of one, since it runs user code while
# it unpickles a large call, and the dispatcher must not wait for it.
BACKGROUND_FRAME_BYTES = 32 << 10


def check_pipeline(depth: int) -> None:
    """Refuse a pipelining depth whose packets might not all fit in a task pipe (rule 2)."""
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"pipeline depth must be a whole number >= 1, not {depth!r}")
    if depth * PIPE_BUF > PACKET_PIPE_BYTES:
        raise ValueError(
            f"a pipeline depth of {depth} could block the dispatcher: {depth} packets of "
            f"{PIPE_BUF} bytes do not fit in a {PACKET_PIPE_BYTES}-byte task pipe (at most "
            f"{PACKET_PIPE_BYTES // PIPE_BUF})")


def background_above(capacity: int | None) -> int:
    """The largest frame, header included, the dispatcher writes itself into an empty pipe
    of ``capacity`` bytes. A capacity of None is not known: the usual 64 KiB is assumed."""
    return min(BACKGROUND_FRAME_BYTES, PACKET_PIPE_BYTES if capacity is None else capacity)


check_pipeline(PIPELINE_DEPTH)
assert HEADER.size < PIPELINE_MAX_FRAME == PIPE_BUF  # rule 1: header and body, one packet
assert BACKGROUND_FRAME_BYTES <= PACKET_PIPE_BYTES  # rule 3, for a pipe that takes packets

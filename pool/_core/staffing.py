"""Staffing: which slots get a worker, and which workers are let go.

Owns: when a slot's worker is started (refill, or on demand), and when an unneeded worker
is asked to stop (retired, idle too long, or the pool ending).
Runs in: the dispatcher thread, inside ``StateMachine``.
Guarantees:
- while the pool is open, a slot whose worker is gone gets a new one at once, unless its
  worker was stopped for idling; workers are also started while queued tasks outnumber
  the places to run them. A draining pool starts workers for its queue only; a broken or
  terminating one starts none;
- after a refused start, nothing starts before the retry time, then one slot at a time;
- with an ``idle_timeout``, a READY worker with nothing in flight for that long is asked
  to stop, and its slot is refilled only when queued work needs it;
- an ending pool stops every worker with nothing left to do.
Assumes: the escalator is what ends a worker.
"""

from __future__ import annotations

from .actions import Action, Spawn
from .escalation import Escalator
from .records import Records
from .stalls import stalled
from .start_failures import StartFailures
from .states import PoolLife, Slot, SlotState


class Staffing:
    __slots__ = ("idle_timeout", "_records", "_starts", "_escalator")

    def __init__(self, records: Records, starts: StartFailures, escalator: Escalator,
                 idle_timeout: float | None) -> None:
        self.idle_timeout = idle_timeout
        self._records = records
        self._starts = starts
        self._escalator = escalator

    def spawn(self) -> list[Action]:
        """Refill emptied slots and start workers for queued tasks, as far as allowed."""
        records = self._records
        life, in_state = records.life, records.in_state
        if life is not PoolLife.OPEN and life is not PoolLife.DRAINING:
            return []
        if not (in_state[SlotState.EMPTY] or in_state[SlotState.UNUSED]):
            return []  # every slot has a process: nothing to start, the common case
        if self._starts.retry_at is not None:
            return []  # the system refused the last start: tick tries again
        # After a refusal, one start at a time, until a worker is READY: a probe.
        probing = self._starts.probing
        if probing and in_state[SlotState.STARTING]:
            return []
        actions: list[Action] = []
        capacity = 0  # places where a queued task could start soon
        now = records.clock()
        for slot in records.slots:
            if slot.state is SlotState.EMPTY and life is PoolLife.OPEN and not slot.idled_out:
                # Refill: a slot that ran a worker gets a new one, work or not, unless
                # its worker idled out: then only when work needs it, below.
                records.move_slot(slot, SlotState.STARTING)
                actions.append(Spawn(slot.index))
                if probing:
                    return actions
            if slot.state is SlotState.STARTING or (
                    slot.state is SlotState.READY and not slot.in_flight
                    and not stalled(slot, now)):
                capacity += 1  # a stalled worker is none: it does not read what it gets
        queued = len(records.queue)
        if queued <= capacity:
            return actions
        # On demand: start workers while queued tasks outnumber the places to run them.
        for slot in records.slots:
            if queued <= capacity:
                break
            if slot.state is SlotState.UNUSED or slot.state is SlotState.EMPTY:
                records.move_slot(slot, SlotState.STARTING)
                actions.append(Spawn(slot.index))
                capacity += 1
                if probing:
                    break
        return actions

    def stop_unneeded(self) -> list[Action]:
        """Stop retired workers once idle; when the pool is ending, also every worker with
        nothing left to do."""
        records = self._records
        life = records.life
        open_ = life is PoolLife.OPEN
        if open_ and not records.in_state[SlotState.RETIRING]:
            return []  # the common case, checked cheaply
        actions: list[Action] = []
        winding_down = not open_ and not records.queue
        for slot in records.slots:
            idle = not slot.in_flight
            if slot.state is SlotState.RETIRING and idle:
                actions += self._escalator.ask_to_stop(slot)
            elif winding_down and slot.state is SlotState.READY and idle:
                actions += self._escalator.ask_to_stop(slot)
            elif winding_down and slot.state is SlotState.STARTING:
                # Not needed any more; it exits at end of file once its initializer is done.
                actions += self._escalator.ask_to_stop(slot)
        return actions

    def idle_deadline(self, slot: Slot) -> float | None:
        """When the slot's worker has idled long enough to be stopped; None if it never
        does: no ``idle_timeout``, busy, not READY, or the pool is not open."""
        if (self.idle_timeout is None or slot.state is not SlotState.READY or slot.in_flight
                or self._records.life is not PoolLife.OPEN):
            return None
        idle_since = slot.worker.idle_since
        return None if idle_since is None else idle_since + self.idle_timeout

    def stop_idle(self, slot: Slot) -> list[Action]:
        """The slot's worker idled too long: ask it to stop, and refill the slot only when
        work needs it."""
        slot.idled_out = True
        return self._escalator.ask_to_stop(slot)

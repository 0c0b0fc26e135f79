"""Ending a worker: the escalation as one table, and how the task it ran ends.

Owns: ``STEPS``, each step's action, grace period and next step; the ``Stopping`` record
of each STOPPING slot: how far its ending has gone, and why.
Runs in: the dispatcher thread, inside ``StateMachine``.
Guarantees: a worker is only ever taken to a harder step: never the same step twice, never
an easier one after a harder. Each step but the last has a grace period from ``Timeouts``;
when it runs out, ``tick`` takes the step's ``then``. The last step reports the process as
unreaped rather than assume it gone. A task running on a worker that is gone ends as the
slot's ``Ending`` says: it died, timed out, was stopped or was terminated.
Assumes: only this part moves a slot to STOPPING.
"""

from __future__ import annotations

import signal
from .values import value_type
from operator import attrgetter
from typing import Callable

from .actions import Action, AskToExit, DumpStack, Fail, FailCause, Signal, Stopped, Unreaped
from .records import Records
from .states import Ending, Escalation, Slot, SlotState, Stopping, TaskState, Timeouts


@value_type(frozen=True)
class Step:
    act: Callable[[int], Action]                # the action, given the slot's index
    grace: Callable[[Timeouts], float] | None   # how long the worker is given after it
    then: Escalation | None                     # the step taken when that grace runs out
    hardness: int                               # a step is taken only after easier ones


def _sigterm(index: int) -> Signal:
    return Signal(index, signal.SIGTERM)


def _sigkill(index: int) -> Signal:
    return Signal(index, signal.SIGKILL)


STEPS: dict[Escalation, Step] = {
    # An idle worker exits at end of file; one that does not is sent SIGTERM.
    Escalation.ASKED: Step(AskToExit, attrgetter("stop"), Escalation.TERMINATED, 0),
    # A timed-out worker writes its stack and exits; one that does not is killed.
    Escalation.DUMPING: Step(DumpStack, attrgetter("dump"), Escalation.KILLED, 1),
    Escalation.TERMINATED: Step(_sigterm, attrgetter("terminate"), Escalation.KILLED, 1),
    Escalation.KILLED: Step(_sigkill, attrgetter("kill"), Escalation.GIVEN_UP, 2),
    Escalation.GIVEN_UP: Step(Unreaped, None, None, 3),
}

assert set(STEPS) == set(Escalation)
assert all((step.then is None) == (step.grace is None) for step in STEPS.values())
assert all(STEPS[step.then].hardness > step.hardness
           for step in STEPS.values() if step.then is not None)


class Escalator:
    """Takes workers through the steps of ``STEPS``."""

    __slots__ = ("_records", "_timeouts")

    def __init__(self, records: Records, timeouts: Timeouts) -> None:
        self._records = records
        self._timeouts = timeouts

    def escalate(self, slot: Slot, step: Escalation) -> list[Action]:
        """Take the slot's worker to ``step``, unless it is at a step as hard already: the
        slot is STOPPING, the step's grace period runs, and its action is returned."""
        row = STEPS[step]
        stopping = slot.stopping
        if stopping is not None and STEPS[stopping.escalation].hardness >= row.hardness:
            return []
        deadline = None if row.grace is None else (
            self._records.clock() + row.grace(self._timeouts))
        if stopping is None:
            self._records.move_slot(slot, SlotState.STOPPING)
            slot.stopping = Stopping(step, deadline)
        else:
            stopping.escalation, stopping.deadline = step, deadline
        return [row.act(slot.index)]

    def next_step(self, slot: Slot) -> list[Action]:
        """The grace of the slot's step ran out: take the next one."""
        assert slot.stopping is not None
        then = STEPS[slot.stopping.escalation].then
        assert then is not None, "a step with no next step has no deadline"
        return self.escalate(slot, then)

    def ask_to_stop(self, slot: Slot) -> list[Action]:
        return self.escalate(slot, Escalation.ASKED)

    def kill(self, slot: Slot) -> list[Action]:
        """SIGKILL the slot's worker now, unless that was done; its exit is expected within
        the kill grace."""
        return self.escalate(slot, Escalation.KILLED)

    def time_out(self, slot: Slot) -> list[Action]:
        """The task the slot's worker runs overran its timeout: ask for its stack, then
        end it; the task fails as timed out."""
        actions = self.escalate(slot, Escalation.DUMPING)
        self._stopping(slot).ending = Ending.TIMED_OUT
        return actions

    def stop_running(self, slot: Slot) -> list[Action]:
        """End the worker running a task the caller stopped, unless its timeout already
        fired: then the timeout is what the caller is told."""
        if slot.stopping is not None and slot.stopping.ending is Ending.TIMED_OUT:
            return []
        actions = self.kill(slot)
        self._stopping(slot).ending = Ending.STOPPED
        return actions

    def terminate(self, slot: Slot, signum: int) -> list[Action]:
        """terminate_workers() or kill_workers(): end the slot's worker now with
        ``signum``, unless it is further along already; a task it runs fails as
        terminated, unless its worker is being ended for another reason."""
        step = Escalation.KILLED if signum == signal.SIGKILL else Escalation.TERMINATED
        actions = self.escalate(slot, step)
        stopping = self._stopping(slot)
        if slot.in_flight and stopping.ending is None:
            stopping.ending = Ending.TERMINATED
        return actions

    def replied_while_ending(self, slot: Slot) -> None:
        """The task the slot's worker ran replied just as the worker was being ended: the
        reply wins over a timeout, and a stop still makes its future cancelled. The worker
        goes anyway."""
        stopping = self._stopping(slot)
        if stopping.ending is Ending.TIMED_OUT or stopping.ending is Ending.STOPPED:
            stopping.ending = None

    def end_running_task(self, slot: Slot, exited: object) -> Action:
        """The slot's worker is gone while it ran a task: that task ends as the slot's
        ``Ending`` says, and as a death if nothing was ending it."""
        task = self._records.tasks[slot.in_flight.popleft()]
        ending = None if slot.stopping is None else slot.stopping.ending
        if ending is Ending.STOPPED:
            self._records.move_task(task, TaskState.CANCELLED)
            return Stopped(task.task_id, ran=True)
        self._records.move_task(task, TaskState.FAILED)
        if ending is Ending.TIMED_OUT:
            assert task.timeout is not None
            return Fail(task.task_id, FailCause.TIMED_OUT, slot.index, task.timeout, exited)
        if ending is Ending.TERMINATED:
            return Fail(task.task_id, FailCause.TERMINATED, slot.index, exited=exited)
        return Fail(task.task_id, FailCause.DIED, slot.index, exited=exited)

    @staticmethod
    def _stopping(slot: Slot) -> Stopping:
        """The slot's ``Stopping``, which ``escalate`` has just made sure of."""
        assert slot.stopping is not None
        return slot.stopping

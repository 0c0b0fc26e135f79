"""What the core's unit tests share: a clock the test moves by hand, and the parts of a
machine wired as ``StateMachine`` wires them, without the machine."""

from __future__ import annotations

from pool._core.escalation import Escalator
from pool._core.lifecycle import Lifecycle
from pool._core.records import Records
from pool._core.staffing import Staffing
from pool._core.start_failures import StartFailures
from pool._core.states import SlotState, Task, Timeouts


class FakeClock:
    """``time.monotonic`` for the core: it says ``now``, which only the test changes."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Parts:
    """Records, start failures, an escalator, staffing and the lifecycle, over one clock."""

    def __init__(self, workers: int = 3, idle_timeout: float | None = None,
                 timeouts: Timeouts = Timeouts()) -> None:
        self.clock = FakeClock()
        self.records = Records(workers, self.clock)
        self.starts = StartFailures()
        self.escalator = Escalator(self.records, timeouts)
        self.staffing = Staffing(self.records, self.starts, self.escalator, idle_timeout)
        self.lifecycle = Lifecycle(self.records, self.starts, self.escalator)

    def queue(self, *task_ids: int) -> None:
        for task_id in task_ids:
            self.records.tasks[task_id] = Task(task_id, 100, True)
            self.records.queue.append(task_id)

    def ready(self, *indexes: int) -> None:
        for index in indexes:
            slot = self.records.slots[index]
            self.records.move_slot(slot, SlotState.STARTING)
            self.records.move_slot(slot, SlotState.READY)

    def empty(self, *indexes: int) -> None:
        for index in indexes:
            self.records.move_slot(self.records.slots[index], SlotState.EMPTY)

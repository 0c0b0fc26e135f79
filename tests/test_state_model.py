"""Random legal event sequences for the state machine, checked against its guarantees.

A small simulated dispatcher owns fake worker processes and feeds the machine every event
a real one could produce, in random order: submissions (some with timeouts), READY,
replies (some out of turn: for a task not running, a second READY, an INIT_FAILED from a
ready worker), deaths (with some of
the bytes last written left unread, down to part of a frame), tasks taken back from a pipe,
cancellations and failed writes discovered at send time, garbage, over-memory reports, stop
requests, shutdown, terminate / kill, workers that keep dying as they start (until the pool
breaks), and the
passing of time (which fires timeouts, idle stops and escalation; a process given up on is dropped, as
the dispatcher does). Whatever happens, the machine must accept it, end every task
exactly once, and close once everything is done.
"""

from __future__ import annotations

import collections
import random
import signal

import pytest

from pool._core import actions as act
from pool._core.states import InvalidTransition, PoolLife, SlotState, TaskState, Timeouts
from pool._core.machine import StateMachine


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock()
        # In some worlds most workers die while starting (an initializer that fails now and
        # then), and replies are rare, so that the pool breaks with tasks running, queued
        # and in the pipes of workers that then die.
        self.flaky_starts = self.rng.random() < 0.3
        # In some, the system refuses a third of the starts (out of descriptors or
        # processes): they are tried again later, and may fail what is queued.
        self.refusing = self.rng.random() < 0.3
        self.machine = StateMachine(
            self.rng.randint(2, 4) if self.flaky_starts else self.rng.randint(1, 3), self.clock,
            max_tasks_per_child=self.rng.choice([None, 1, 2, 5]),
            pipeline_depth=self.rng.choice([1, 2, 3]), timeouts=Timeouts(3, 2, 5),
            idle_timeout=self.rng.choice([None, None, 0.5, 5]))
        self.alive: dict[int, dict] = {}     # slot -> fake process: {"ready": bool}
        self.ended: dict[int, str] = {}      # task id -> how it ended
        self.next_task = 1
        self.frame_bytes: dict[int, int] = {}  # task id -> the size of its CALL frame
        self.shut = False
        self.unscheduled = False  # the last event queued a task without scheduling

    def perform(self, actions):
        work = list(actions)
        while work:
            action = work.pop(0)
            if isinstance(action, act.Spawn):
                assert action.index not in self.alive, "spawned into a live slot"
                roll = self.rng.random()
                if roll < 0.05:
                    work += self.machine.spawn_failed(action.index)
                elif self.refusing and roll < 0.38:
                    work += self.machine.spawn_refused(action.index)
                else:
                    self.alive[action.index] = {"ready": False}
            elif isinstance(action, act.Send):
                assert action.index in self.alive and self.alive[action.index]["ready"]
                roll = self.rng.random()
                if roll < 0.1:
                    self.end(action.task_id, "cancelled at send")
                    work += self.machine.send_cancelled(action.index, action.task_id)
                elif roll < 0.15:
                    work += self.machine.send_failed(action.index, action.task_id)
            elif isinstance(action, (act.Resolve, act.Fail, act.Cancel, act.Stopped)):
                self.end(action.task_id, type(action).__name__)
            elif isinstance(action, (act.AskToExit, act.Signal, act.DumpStack)):
                # (Or for a slot whose start failed after this action was decided: then
                # the slot is empty, and the loop skips it.)
                assert action.index in self.alive or self.machine.slots[action.index].state in (
                    SlotState.EMPTY, SlotState.UNUSED), f"{action} for a slot with no process"
            elif isinstance(action, act.Reclaim):
                # The worker reads its pipe while the parent takes tasks back: any of them
                # may have gone either way (the running one rarely: it is read at once).
                assert action.index in self.alive, f"{action} for a slot with no process"
                in_flight = list(self.machine.slots[action.index].in_flight)
                head_odds = 0.1
                taken = [t for i, t in enumerate(in_flight)
                         if self.rng.random() < (head_odds if i == 0 else 0.6)]
                work += self.machine.tasks_reclaimed(action.index, taken)
            elif isinstance(action, act.Unreaped):
                assert action.index in self.alive
                del self.alive[action.index]  # the dispatcher abandons it and says so
                work += self.machine.worker_exited(action.index)
            elif isinstance(action, (act.Broken, act.WorkerGone, act.Misbehaved)):
                pass
            else:
                raise AssertionError(action)

    def end(self, task_id, how):
        assert task_id not in self.ended, f"task {task_id} ended twice: {self.ended[task_id]}, {how}"
        self.ended[task_id] = how

    def step(self):
        m, rng = self.machine, self.rng
        choices = []
        if not self.shut and not m.closed:  # (a broken pool closes by itself; the
            # dispatcher then refuses submissions: its loop has ended)
            choices += ["submit"] * 3 + ["shutdown"] * (1 if rng.random() < 0.02 else 0)
        starting = [s for s in self.alive if not self.alive[s]["ready"]]
        busy = [s for s in self.alive if m.slots[s].in_flight]
        # (Flaky worlds reply seldom, so that the pool often breaks with tasks in flight.)
        choices += ["ready"] * len(starting) * 2
        choices += ["reply"] * len(busy) * (1 if self.flaky_starts else 3)
        choices += ["die"] * (1 if self.alive and rng.random() < (0.5 if self.flaky_starts
                                                                   else 0.2) else 0)
        choices += ["garbage"] * (1 if busy and rng.random() < 0.05 else 0)
        ready = [s for s in self.alive if self.alive[s]["ready"]
                 and m.slots[s].state in (SlotState.READY, SlotState.RETIRING)]
        choices += ["out of turn"] * (1 if (busy or ready) and rng.random() < 0.05 else 0)
        choices += ["memory"] * (1 if busy and rng.random() < 0.05 else 0)
        choices += ["stop"] * (1 if self.next_task > 1 and rng.random() < 0.1 else 0)
        choices += ["cancel"] * (1 if self.next_task > 1 and rng.random() < 0.1 else 0)
        choices += ["terminate"] * (1 if rng.random() < 0.01 else 0)
        choices += ["tick", "schedule"]
        choice = rng.choice(choices)
        if choice not in ("tick", "stop", "terminate", "cancel"):  # may schedule nothing
            self.unscheduled = False
        if choice == "submit":
            task_id, self.next_task = self.next_task, self.next_task + 1
            timeout = rng.choice([None, None, 0.5, 3])
            burst = rng.random() < 0.3  # queued now, scheduled by the next event
            self.unscheduled = burst
            frame_bytes = rng.choice([60, 200, 4096]) if rng.random() < 0.7 else 70_000
            self.frame_bytes[task_id] = frame_bytes
            self.perform(m.submit(task_id, frame_bytes=frame_bytes, timeout=timeout,
                                  schedule=not burst))
        elif choice == "shutdown":
            self.shut = True
            self.perform(m.shutdown(cancel_futures=rng.random() < 0.5))
        elif choice == "ready":
            slot = rng.choice(starting)
            if self.flaky_starts and rng.random() < 0.7:
                self.die(slot)
                return
            self.alive[slot]["ready"] = True
            self.perform(m.worker_ready(slot, pipelining=rng.random() < 0.8))
        elif choice == "reply":  # one, or several read together (the last perhaps wrong)
            slot = rng.choice(busy)
            in_flight = list(m.slots[slot].in_flight)
            batch = [(t, (True, None)) for t in in_flight[:rng.randint(1, len(in_flight))]]
            if rng.random() < 0.1:
                batch.append((rng.randrange(1, self.next_task + 1), (True, None)))
            self.perform(m.tasks_replied(slot, batch))
        elif choice == "die":  # (in flaky worlds, often one that runs: see flaky_starts)
            self.die(rng.choice(busy if busy and self.flaky_starts and rng.random() < 0.5
                                else list(self.alive)))
        elif choice == "garbage":
            self.perform(m.worker_misbehaved(rng.choice(busy), "garbage"))
        elif choice == "out of turn":  # the machine, not the dispatcher, must see it
            if busy and (not ready or rng.random() < 0.5):
                slot = rng.choice(busy)
                wrong = rng.choice([t for t in range(1, self.next_task + 1)
                                    if t != m.slots[slot].in_flight[0]])
                self.perform(m.task_replied(slot, wrong, (True, None)))
            elif rng.random() < 0.5:
                self.perform(m.worker_ready(rng.choice(ready)))
            else:
                self.perform(m.worker_init_failed(rng.choice(ready)))
        elif choice == "memory":
            self.perform(m.worker_over_memory(rng.choice(busy)))
        elif choice == "stop":  # any task, perhaps one that has ended already
            self.perform(m.stop_task(rng.randrange(1, self.next_task)))
        elif choice == "cancel":  # callers cancel a few futures, queued or not, at once
            ids = [rng.randrange(1, self.next_task) for _ in range(rng.randint(1, 4))]
            self.perform(m.callers_cancelled(ids))
        elif choice == "schedule":
            self.perform(m.schedule())
        elif choice == "terminate":
            self.shut = True
            self.perform(m.terminate(rng.choice([signal.SIGTERM, signal.SIGKILL])))
        else:
            self.clock.now += rng.choice([0.001, 0.1, 1, 4])
            self.perform(m.tick())

    def die(self, slot):
        del self.alive[slot]
        # Any suffix of what was written to it may be unread, to the byte: whole frames
        # (those never started), and part of the one it was reading (started).
        sizes = [self.frame_bytes[t] for t in self.machine.slots[slot].in_flight]
        if sizes and self.rng.random() < 0.5:  # whole frames: the last k never started
            unread = sum(sizes[len(sizes) - self.rng.randint(0, len(sizes)):])
        else:
            unread = self.rng.randint(0, sum(sizes)) if sizes else 0
        self.perform(self.machine.worker_exited(slot, unread_bytes=unread, exited=object()))

    def finish(self):
        """Shut down and let every worker behave until the machine closes."""
        m = self.machine
        if not self.shut:
            self.shut = True
            roll = self.rng.random()
            if roll < 0.2:
                self.perform(m.terminate(self.rng.choice([signal.SIGTERM, signal.SIGKILL])))
            else:
                self.perform(m.shutdown(cancel_futures=roll < 0.6))
        for _ in range(10_000):
            if m.closed:
                return
            for slot in list(self.alive):  # the first worker with something to do does it
                state = m.slots[slot].state
                if not self.alive[slot]["ready"] and state is not SlotState.STOPPING:
                    self.alive[slot]["ready"] = True
                    self.perform(m.worker_ready(slot))
                elif m.slots[slot].in_flight:
                    self.perform(m.task_replied(slot, m.slots[slot].in_flight[0]))
                elif state is SlotState.STOPPING:
                    self.die(slot)  # it was asked (or signalled) to exit: it does
                else:
                    continue  # idle (stalled, say): the next one
                break
            else:
                self.clock.now += 10
                self.perform(m.tick())
        raise AssertionError("the machine never closed")


@pytest.mark.parametrize("seed", range(400))
def test_random_event_sequences_keep_every_guarantee(seed):
    world = World(seed)
    try:
        for _ in range(world.rng.randint(0, 300)):
            world.step()
            m = world.machine
            queued = m.queued
            assert len(queued) == len(set(queued)) == m.census()[0]  # cancels leave no trace
            assert all(m.task_state(t) is TaskState.QUEUED for t in queued)
            counted = {state: n for state, n in m._records.in_state.items() if n}
            assert counted == collections.Counter(s.state for s in m.slots)
            if m.life is PoolLife.BROKEN and m.queued:
                assert any(s.state is SlotState.READY for s in m.slots), \
                    "a broken pool holds a queue no worker will take"
            if m.queued and not (m.life is PoolLife.TERMINATING or world.unscheduled):
                # queued work always has a worker starting or running, or a start that the
                # system refused is to be tried again (at a deadline, so the loop wakes)
                assert any(s.state not in (SlotState.UNUSED, SlotState.EMPTY)
                           for s in m.slots) or (
                    m._starts.retry_at is not None
                    and m.next_deadline() <= m._starts.retry_at), \
                    "work queued, no worker started or running"

        world.finish()
    except InvalidTransition as exc:
        pytest.fail(f"seed {seed}: the machine refused a legal event: {exc}")
    submitted = set(range(1, world.next_task))
    assert set(world.ended) == submitted, f"never ended: {submitted - set(world.ended)}"
    assert world.machine.closed and not world.alive
    assert all(s.state in (SlotState.UNUSED, SlotState.EMPTY) for s in world.machine.slots)

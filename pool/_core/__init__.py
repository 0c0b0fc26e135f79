"""The core: the pool's protocol as a pure state machine, and its policies as parts.

Owns: the states of a task, a slot and the pool with their transition tables (``states``);
the records and the one place that moves them (``records``); the actions the machine
answers with (``actions``); the machine itself (``machine``), which takes events and
returns actions; and its parts: ``placement`` (which worker runs which task),
``staffing`` (which slots get a worker), ``escalation`` (ending a worker),
``start_failures`` (failed and refused starts), ``stalls`` (workers that do not read),
``lifecycle`` (how the pool winds down), ``deadlines`` (every deadline, for the wait and
for ``tick``), and ``backoff`` (doubling waits).
Runs in: the dispatcher thread, which feeds it events and carries out its actions.
Guarantees: no I/O and no threads: nothing here imports ``os``, ``threading``,
``multiprocessing``, ``socket``, ``select`` or ``subprocess`` (``tests/test_imports.py``
holds it), so every rule can be tested by feeding events under a fake clock.
"""

"""The core: the pool's protocol as a pure state machine.

Owns: the states of a task, a slot and the pool with their transition tables (``states``),
the actions the machine answers with (``actions``), and the machine itself (``machine``),
which takes events and returns actions.
Runs in: the dispatcher thread, which feeds it events and carries out its actions.
Guarantees: no I/O and no threads: nothing here imports ``os``, ``threading``,
``multiprocessing``, ``socket``, ``select`` or ``subprocess`` (``tests/test_imports.py``
holds it), so every rule can be tested by feeding events under a fake clock.
"""

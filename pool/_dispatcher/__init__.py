"""The dispatcher: the one thread that owns every worker, pipe and in-flight task.

Owns: what callers touch (``front``: the ``Dispatcher`` and its ``Admission``), the loop
(``loop``, whose picture opens it), turning a worker's frames into events (``events``),
carrying out the state machine's actions (``perform``), what is left of gone workers
(``reaper``), what crosses between callers and the loop (``commands``), the wakeup handle
(``wakeup``) and how futures end (``outcomes``).
Runs in: the dispatcher thread, and callers' threads where a module says so.
"""

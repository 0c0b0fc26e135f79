"""The dispatcher: the one thread that owns every worker, pipe and in-flight task.

Owns: the loop (``loop``, whose picture opens it), what callers hand it (``commands``), the
wakeup handle (``wakeup``) and how futures end (``outcomes``).
Runs in: the dispatcher thread, and callers' threads where a module says so.
"""

"""The wire between the parent and a worker: frames, pipes, pickling and their limits.

Owns: the frame format (``frames``), the pipe mechanics under it (``pipes``), what crosses
and how (``pickling``, a task's calls and results; ``exceptions``, a task's exception with
its frames and chain; ``picklers``, the picklers both write with), and the
sizes that depend on each other (``limits``).
Runs in: both sides: the dispatcher thread (and its large-frame writers), callers' threads
(pickling a call) and the worker process.
"""

"""One worker process, from both sides.

Owns: in the worker, its main (``main``) and its inherited streams (``streams``). In the
parent: the handle on one worker (``handle``); ending processes and reading what they
left (``teardown``); the checks that workers can start at all (``main_guard``); what the
forkserver preloads (``forkserver``).
Assumes: a worker imports ``pool._worker.main`` and what it needs, nothing of the parent's
side: this file imports nothing, so that importing the package costs nothing.
"""

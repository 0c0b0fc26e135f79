"""The command line, ``python -m pool``: ``demo``, ``map`` and ``run``.

Owns: parsing and dispatch (``main``); what every command says to the terminal and its
exit statuses (``console``); ``map``'s options, inputs, job log, output lines and
its run (``options``, ``inputs``, ``joblog``, ``lines``, ``write``, ``output``,
``results``; ``map_run``, which coordinates ``map_events``, ``map_jobs`` and ``map_end``)
and what it runs in a worker (``task``); ``run`` (``program``); the demo (``demo``).
Assumes: nothing outside this package imports it (``tests/test_imports.py`` holds it). A
worker imports ``pool._cli.task`` (or ``demo``) when it unpickles a job: this file imports
nothing, so that costs nothing more.
"""

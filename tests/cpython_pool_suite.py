"""Runs CPython's own ``multiprocessing.Pool`` tests against ``pool.Pool``: the classes
``_TestPool``, ``_TestPoolWorkerErrors`` and ``_TestPoolWorkerLifetime`` of
``test/_test_multiprocessing.py``, as ``test.test_multiprocessing_<method>.test_processes``
installs them, with ``pool.patch()`` active so that their ``multiprocessing.Pool(...)``
makes pool's. Prints one JSON line per test: ``{"test": name, "outcome": ..., "detail":
...}``, then ``{"done": true}``. Run by ``tests/test_cpython_pool_suite.py`` in a child
interpreter under a hard timeout; usable by hand::

    python tests/cpython_pool_suite.py forkserver
"""

from __future__ import annotations

import importlib
import json
import sys
import unittest

CLASSES = ("WithProcessesTestPool", "WithProcessesTestPoolWorkerErrors",
           "WithProcessesTestPoolWorkerLifetime")


class _Recorder(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, tuple[str, str]] = {}

    def _name(self, test: unittest.TestCase) -> str:
        return ".".join(test.id().split(".")[-2:])

    def addSuccess(self, test: unittest.TestCase) -> None:
        self.outcomes[self._name(test)] = ("passed", "")

    def addFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addFailure(test, err)  # type: ignore[arg-type]
        self.outcomes[self._name(test)] = ("failed", self.failures[-1][1].strip()
                                           .splitlines()[-1][:300])

    def addError(self, test: unittest.TestCase, err: object) -> None:
        super().addError(test, err)  # type: ignore[arg-type]
        self.outcomes[self._name(test)] = ("error", self.errors[-1][1].strip()
                                           .splitlines()[-1][:300])

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self.outcomes[self._name(test)] = ("skipped", reason)

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        print(json.dumps({"started": self._name(test)}), flush=True)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        name = self._name(test)
        outcome, detail = self.outcomes.get(name, ("error", "no outcome"))
        print(json.dumps({"test": name, "outcome": outcome, "detail": detail}), flush=True)


def main(start_method: str) -> None:
    import pool
    patch = pool.patch()
    module = importlib.import_module(f"test.test_multiprocessing_{start_method}.test_processes")
    suite = unittest.TestSuite()
    for name in CLASSES:
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(getattr(module, name)))
    module.setUpModule()
    try:
        suite.run(_Recorder())
    finally:
        module.tearDownModule()
        patch.undo()
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

"""What every command of ``python -m pool`` says to the terminal, and how it ends: a line
on standard error, flushing without failing, whether a descriptor is open, and the exit
statuses.

Owns: nothing but these functions and the exit statuses.
Runs in: the command's main thread.
Guarantees: nothing here raises for a closed or broken standard stream: a command that
has lost its terminal still ends with its status.
Assumes: nothing; it imports no other module of the command line (they import it).
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Exit statuses of ``map`` (GNU parallel's convention, plus the shell's for signals);
# ``run`` ends with its program's status, or EXIT_USAGE.
EXIT_OK = 0               # every input succeeded
EXIT_MANY_FAILED = 101    # more than 100 inputs failed (1-100: exactly that many failed)
EXIT_USAGE = 255          # bad options, function, input or job log; standard output
                          # failing; an internal error (each explained on standard error)
EXIT_INTERRUPTED = 130    # Ctrl-C (128 + SIGINT)
EXIT_PIPE = 141           # standard output was closed (128 + SIGPIPE), e.g. by `| head`


def say(text: str) -> None:
    """A line on standard error, if there is one to write to."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
    except Exception:
        pass


def flush_quietly(stream: Any) -> None:
    try:
        if stream is not None:
            stream.flush()
    except Exception:
        pass


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True

"""Test helper: end a launched test script's process without the interpreter's finalization.

A gloo worker thread can still hold the last reference to a finished collective when the main thread has reached the
interpreter's finalization; releasing it frees the Python tensors the collective kept, the thread can no longer take
the GIL, and the process aborts: "terminate called without an active exception" (pytorch/pytorch#190489). A core
dump of one such abort: ``ProcessGroupGloo::runLoop`` destroying an ``AsyncBarrierWork`` whose prior
``AsyncAllgatherWork`` held Python tensors, the main thread in ``Py_FinalizeEx``. On this 2-core machine with two
busy processes beside it, it ended 3 of 32 launches of the two-node test (1 of the 4 where ``acpo-train`` destroyed its
process group at its end), and 0 of 60 with this exit; in CI the other node's launcher waited 300 s at its exit barrier
and the test failed. A test script has written all it records by then.
"""

from __future__ import annotations

import os
import sys


def exit_now(status: int = 0) -> None:
    """Flush the output and leave with ``status``, skipping the interpreter's finalization."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

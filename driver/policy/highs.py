"""A HiGHS solver instance that prints nothing.

HiGHS writes a two-line banner from C straight to file descriptor 1 when a process builds its first
instance, before any option can turn output off. On the controller and `flexmig simulate --json`
stdout is a machine-read stream (JSON log lines, one JSON document), so the first instance is built
with descriptor 1 pointed at descriptor 2 for that moment; later instances print nothing.
"""

from __future__ import annotations

import os
import sys
import threading

import highspy

_first_built = False
_lock = threading.Lock()


def quiet_highs() -> highspy.Highs:
    """A new `highspy.Highs` with output off; the process's first one built with stdout on stderr."""
    global _first_built
    with _lock:
        if _first_built:
            h = highspy.Highs()  # type: ignore[no-untyped-call]
        else:
            sys.stdout.flush()
            saved = os.dup(1)
            try:
                os.dup2(2, 1)
                h = highspy.Highs()  # type: ignore[no-untyped-call]
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            _first_built = True
    h.setOptionValue("output_flag", False)
    return h


__all__ = ["quiet_highs"]

"""A HiGHS solver instance that prints nothing.

HiGHS writes a two-line banner from C straight to file descriptor 1 when a process builds its first
instance, before any option can turn output off. `flexmig simulate --json` writes one JSON document to
stdout, and nothing of ours should write to a stream it does not own, so the first instance is built
with descriptor 1 pointed at descriptor 2 for that moment (another thread's stdout output in that
moment goes to stderr too: it is lost to neither); later instances print nothing. If the descriptors
cannot be duplicated (out of file descriptors), the banner goes to stdout rather than the solve failing.
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
            try:
                saved = os.dup(1)
            except OSError:
                saved = -1
            if saved < 0:
                h = highspy.Highs()  # type: ignore[no-untyped-call]
            else:
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

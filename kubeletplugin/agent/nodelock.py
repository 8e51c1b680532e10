"""One plugin instance per node: an exclusive lock taken before anything else is touched.

The startup reconcile destroys instances it believes stale, so a second instance (a rolling update
with surge, an operator's manual run) must find out that it is second before it reconciles, not when
it later fails to bind the sockets. At start the plugin therefore:

1. takes an exclusive, non-blocking `flock` on `plugin.lock` beside the checkpoint (held for the
   process's life; the kernel releases it when the process dies, even on SIGKILL), and writes its PID
   into the file for the error message of the next one;
2. checks that nobody serves on its registration and DRA sockets (an instance of an older flexmig
   that does not take the lock).

Either failure exits with a message naming the lock file or the socket and the holder, having changed
nothing (no NVML call, no checkpoint read, no socket removed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Sequence
from pathlib import Path

LOCK_NAME = "plugin.lock"


class NodeBusy(Exception):
    """Another plugin instance runs on this node."""


class NodeLock:
    def __init__(self, checkpoint_path: Path) -> None:
        self.path = checkpoint_path.with_name(LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise NodeBusy; OSError when the directory cannot be created or opened."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise NodeBusy(
                f"another flexmig kubelet plugin runs on this node (it holds {self.path}, pid {holder});"
                " this instance exits without touching anything"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def check_sockets_free(sockets: Sequence[Path], in_use: Callable[[Path], bool]) -> None:
    """Raise NodeBusy when a server already answers on any of `sockets`."""
    for sock in sockets:
        if in_use(sock):
            raise NodeBusy(
                f"socket {sock} is served by another running plugin instance; this instance exits"
                " without touching anything"
            )

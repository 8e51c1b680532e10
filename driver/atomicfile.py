"""Replace a file atomically: a reader sees the old file or the new one, never a half-written one.

The new content goes to a temp file in the target's own directory (a rename is atomic only within one
file system), which is then renamed over the target with `os.replace`. On any error before the rename
the temp file is removed and the target is untouched; a process killed in between leaves at worst a
stray temp file named `<prefix><random><suffix>`, which a caller can recognise and remove.

Durability is the caller's choice, because it costs an fsync (or two) per write:

- `durable=True` fsyncs the temp file before the rename, so after a power loss the target holds the
  old bytes or the complete new ones; and, unless `sync_dir=False`, fsyncs the directory after the
  rename, so the rename itself survives a power loss once the call returns.
- `durable=False` gives atomicity against a killed process only (what the simulator's call counters
  and test markers need).

`os.replace` and `os.fsync` are looked up on the `os` module at call time, so a test that patches them
(for example `monkeypatch.setattr("os.replace", ...)`) sees every write made through here.

`replace_with` is the same rename for a temp entry that is not written but made (a device node by
`os.mknod`, kubeletplugin/prepare/devnodes.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

DEFAULT_SUFFIX = ".tmp"


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the directory's entries (a rename, an unlink) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def default_prefix(target: Path) -> str:
    """`.<name>.`: a dot-file, so directory scanners that load `*.json` never pick a temp file up."""
    return f".{target.name}."


def write_atomically(
    target: str | os.PathLike[str],
    data: bytes,
    *,
    durable: bool,
    sync_dir: bool | None = None,
    mode: int | None = None,
    prefix: str | None = None,
    suffix: str = DEFAULT_SUFFIX,
) -> Path:
    """Replace `target` with `data`; the target's path.

    `sync_dir` defaults to `durable`; `mode` is applied to the temp file before the rename (temp files
    are created 0600). The target's directory must exist.
    """
    path = Path(target)
    fd, tmp = tempfile.mkstemp(
        prefix=default_prefix(path) if prefix is None else prefix, suffix=suffix, dir=path.parent
    )

    def fill() -> None:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())

    _install(Path(tmp), path, fill, mode)
    if durable if sync_dir is None else sync_dir:
        fsync_dir(path.parent)
    return path


def replace_with(
    target: str | os.PathLike[str],
    make: Callable[[Path], None],
    *,
    sync_dir: bool = False,
    mode: int | None = None,
) -> Path:
    """Replace `target` with what `make(temp)` creates at a temp path in the same directory.

    The temp name, `.<name>.<pid>.<thread>.tmp`, is owned by this thread; one left behind by an earlier
    attempt of the same thread is removed first, since `make` may refuse an existing path (`os.mknod`).
    `mode` is applied after `make` (mknod's mode is filtered by the umask). The entry is not fsynced
    (it need not be a regular file); `sync_dir` fsyncs the directory after the rename.
    """
    path = Path(target)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}{DEFAULT_SUFFIX}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    _install(tmp, path, lambda: make(tmp), mode)
    if sync_dir:
        fsync_dir(path.parent)
    return path


def _install(tmp: Path, path: Path, fill: Callable[[], None], mode: int | None) -> None:
    """Fill `tmp`, set its mode and rename it over `path`; on any error the temp is removed."""
    try:
        fill()
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


__all__ = ["DEFAULT_SUFFIX", "default_prefix", "fsync_dir", "replace_with", "write_atomically"]

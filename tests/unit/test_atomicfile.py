"""driver/atomicfile.py: the target is replaced whole or not at all, the temp file never stays behind,
the mode is applied, and the file and its directory are fsynced exactly when asked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from driver.atomicfile import replace_with, write_atomically


class FsyncLog:
    """Wraps os.fsync: records 'dir' or 'file:<content>' for every fsync."""

    def __init__(self) -> None:
        self.real = os.fsync
        self.calls: list[str] = []

    def __call__(self, fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self.calls.append("dir")
        else:
            self.calls.append("file:" + os.pread(fd, st.st_size, 0).decode())
        self.real(fd)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> FsyncLog:
    log = FsyncLog()
    monkeypatch.setattr(os, "fsync", log)
    return log


def test_replaces_content_and_leaves_only_the_target(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    target.write_bytes(b"old")
    assert write_atomically(target, b"new", durable=True) == target
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_the_target_is_a_new_inode_not_rewritten_in_place(tmp_path: Path) -> None:
    """A reader holding the old file open keeps reading the old content: the write was a rename."""
    target = tmp_path / "state"
    target.write_bytes(b"old content")
    with target.open("rb") as reader:
        write_atomically(target, b"new", durable=False)
        assert reader.read() == b"old content"
    assert target.read_bytes() == b"new"


def test_failed_rename_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cp.json"
    target.write_bytes(b"old")
    seen: list[str] = []

    def boom(src: str, dst: str) -> None:
        seen.append(Path(src).read_text())
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, b"new", durable=True)
    assert seen == ["new"]  # the temp held the full content when the rename was tried
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["cp.json"]


def test_failed_write_removes_the_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(fd: int) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="I/O error"):
        write_atomically(tmp_path / "x", b"data", durable=True)
    assert list(tmp_path.iterdir()) == []


def test_temp_name_is_a_hidden_dot_file_or_the_callers_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temps: list[Path] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        temps.append(Path(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_atomically(tmp_path / "a.json", b"1", durable=False)
    write_atomically(tmp_path / "b", b"2", durable=False, prefix="b.")
    assert [t.parent for t in temps] == [tmp_path, tmp_path]  # same directory: the rename is atomic
    assert temps[0].name.startswith(".a.json.") and temps[0].name.endswith(".tmp")
    assert temps[1].name.startswith("b.") and temps[1].name.endswith(".tmp")


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o444])
def test_mode_is_applied(tmp_path: Path, mode: int) -> None:
    target = write_atomically(tmp_path / "f", b"x", durable=False, mode=mode)
    assert stat.S_IMODE(target.stat().st_mode) == mode


def test_without_mode_the_file_is_private(tmp_path: Path) -> None:
    target = write_atomically(tmp_path / "f", b"x", durable=False)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_durable_fsyncs_the_file_before_and_the_directory_after_the_rename(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    write_atomically(tmp_path / "f", b"payload", durable=True)
    assert fsyncs.calls == ["file:payload", "dir"]


def test_durable_without_directory_sync(tmp_path: Path, fsyncs: FsyncLog) -> None:
    write_atomically(tmp_path / "f", b"payload", durable=True, sync_dir=False)
    assert fsyncs.calls == ["file:payload"]


def test_not_durable_fsyncs_nothing(tmp_path: Path, fsyncs: FsyncLog) -> None:
    write_atomically(tmp_path / "f", b"payload", durable=False)
    assert fsyncs.calls == []
    assert (tmp_path / "f").read_bytes() == b"payload"


def test_replace_with_renames_what_make_created(tmp_path: Path, fsyncs: FsyncLog) -> None:
    target = tmp_path / "link"
    target.write_text("old")
    made: list[Path] = []

    def make(tmp: Path) -> None:
        assert not tmp.exists() and tmp.parent == tmp_path
        made.append(tmp)
        tmp.write_text("made")

    replace_with(target, make, mode=0o444)
    assert target.read_text() == "made" and stat.S_IMODE(target.stat().st_mode) == 0o444
    assert [p.name for p in tmp_path.iterdir()] == ["link"]
    assert fsyncs.calls == []  # the made entry is never fsynced, the directory only on request
    replace_with(target, lambda tmp: tmp.write_text("again"), sync_dir=True)
    assert fsyncs.calls == ["dir"]


def test_replace_with_removes_a_stale_temp_and_cleans_up_on_error(tmp_path: Path) -> None:
    target = tmp_path / "node"
    seen: list[Path] = []

    def make_exclusive(tmp: Path) -> None:
        seen.append(tmp)
        with tmp.open("x") as f:  # like mknod: refuses an existing path
            f.write("x")

    # Leave a temp behind as a killed attempt would, then run again: it is cleared first.
    def fail(tmp: Path) -> None:
        make_exclusive(tmp)
        raise OSError("mknod failed half-way")

    with pytest.raises(OSError, match="half-way"):
        replace_with(target, fail)
    assert list(tmp_path.iterdir()) == []  # cleaned on error
    seen[0].write_text("stale")
    replace_with(target, make_exclusive)
    assert seen[1] == seen[0] and target.read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["node"]

"""Every file the project writes goes through storage/atomic.py: made under a temporary name,
flushed to the disk, renamed, the folder flushed. Measured by what the programs fsync."""

import errno
import os
import sys

import pytest

import export
from conftest import ROOT, untrained_run
from data.config import DataConfig
from jobs import prepare
from storage import atomic

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="names an fsync'd file by /proc/self/fd")


@pytest.fixture
def flushed(monkeypatch):
    """The paths the process fsyncs (files and folders), as they are named when flushed."""
    paths = []
    real = os.fsync

    def fsync(fd):
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    return paths


def written_under(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def flushed_under(paths: list[str], folder, tmp_name: str) -> set[str]:
    """The files flushed while they were under `tmp_name` (the temporary folder `folder` was
    made as), named as they are under `folder` now."""
    prefix = str(folder.with_name(tmp_name)) + os.sep
    return {path[len(prefix):] for path in paths if path.startswith(prefix)}


@linux_only
def test_an_export_a_gguf_file_and_token_files_are_flushed_before_they_are_renamed(tmp_path, flushed, corpus):
    run = untrained_run(tmp_path / "run")
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    pid = os.getpid()
    assert flushed_under(flushed, tmp_path / "hf", f"hf.tmp-{pid}") == written_under(tmp_path / "hf")
    assert str(tmp_path / f"hf.tmp-{pid}") in flushed and str(tmp_path) in flushed  # the folder, then its parent
    flushed.clear()
    assert export.main(["--checkpoint", str(run), "--out", str(tmp_path / "m.gguf")]) == 0
    assert flushed == [str(tmp_path / f"m.gguf.tmp-{pid}"), str(tmp_path)]
    flushed.clear()
    data = prepare(DataConfig(str(corpus), cache_dir=str(tmp_path / "cache")), progress=False)
    made = flushed_under(flushed, data.directory, f"{data.directory.name}.tmp-{pid}")
    assert made == written_under(data.directory) and {"tokenizer.json", "train.bin", "val.bin", "meta.json"} <= made


@linux_only
def test_a_run_folders_files_are_flushed_as_a_checkpoint_writes_them(tmp_path, flushed, micro):
    import train

    assert train.main(["--config", str(ROOT / "configs" / "tiny.yaml"),
                       *micro("train.max_iters=2", "train.eval_interval=2", "train.sample_tokens=0")]) == 0
    run = tmp_path / "run"
    names = {os.path.basename(path).rsplit(".tmp-", 1)[0] for path in flushed if ".tmp-" in path}
    assert {"model.safetensors", "config.json", "tokenizer.json", "summary.json", "trainer_state.pt",
            "config.yaml"} <= names
    assert str(run) in flushed and not any(".tmp" in p.name for p in run.rglob("*"))


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"old")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        atomic.write_atomic(tmp_path / "f", b"new")
    with pytest.raises(OSError, match="No space left"):
        with atomic.replaced(tmp_path / "folder") as tmp:
            tmp.mkdir()
            (tmp / "a").write_bytes(b"a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"] and (tmp_path / "f").read_bytes() == b"old"

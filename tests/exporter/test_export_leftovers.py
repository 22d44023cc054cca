"""Exports clean up after themselves: what a killed export left is removed by the next export to
the same place, and never a folder that a running export still writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_exporter
from specx.runtime.artifact.contract import Manifest

pytestmark = needs_exporter


def tiny_target(tokenizer: Any, folder: Path) -> str:
    import tiny_models

    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=3)
    return str(tiny_models.save(model, tokenizer, folder))


def test_an_export_killed_midway_is_cleaned_up_by_the_next_one(
    tmp_path: Path, tokenizer: Any
) -> None:
    from specx.exporter import ExportOptions, export_pair

    target = tiny_target(tokenizer, tmp_path / "t")
    out = tmp_path / "artifact"
    env = {k: v for k, v in os.environ.items() if k != "SPECX_THREAD_POOL"}
    cmd = [sys.executable, "-m", "specx.apps.cli.main", "export", "--target", target]
    cmd += ["--draft", "int8", "--max-length", "64", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 300
    partial: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        partial = list(tmp_path.glob(".artifact.partial-*"))
        if partial and (partial[0] / "target.onnx").exists():
            break  # midway: the target is written, the int8 draft is still to come
        time.sleep(0.02)
    assert proc.poll() is None, "the export ended before it could be killed midway"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert partial and partial[0].exists() and not out.exists()  # what a kill leaves

    lines: list[str] = []
    export_pair(target, [], out, ExportOptions(max_length=64), log=lines.append)
    said = [line for line in lines if "did not finish" in line]
    assert len(said) == 1 and partial[0].name in said[0], lines
    assert not list(tmp_path.glob(".artifact.*"))  # no partial folder, no lock, no backup
    assert Manifest.read(out).target.max_length == 64
    assert not (out / ".specx-export.lock").exists()


def test_a_folder_that_a_running_export_writes_is_left_alone(tmp_path: Path) -> None:
    from specx.exporter.staging import StagedFolder, remove_leftovers

    out = tmp_path / "artifact"
    lines: list[str] = []
    with StagedFolder(out, lines.append) as running:
        (running.path / "target.onnx").write_bytes(b"half")
        remove_leftovers(out, lines.append)  # another export starting meanwhile
        assert running.path.exists()
        assert any("alone" in line for line in lines)
    assert not running.path.exists()  # left without publishing: removed by its own export


def test_unlocked_leftovers_of_older_exports_and_stale_backups_are_handled(tmp_path: Path) -> None:
    from specx.exporter.staging import remove_leftovers

    out = tmp_path / "artifact"
    old, fresh = tmp_path / ".artifact.partial-old1", tmp_path / ".artifact.partial-new1"
    backup = tmp_path / ".artifact.old-1234"
    for folder in (old, fresh, backup):
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
    hour_ago = time.time() - 3600
    for path in (old, old / "manifest.json", backup, backup / "manifest.json"):
        os.utime(path, (hour_ago, hour_ago))
    lines: list[str] = []
    remove_leftovers(out, lines.append)
    assert not old.exists() and fresh.exists()  # an unlocked folder still changing may be live
    assert out.exists() and not backup.exists()  # an interrupted replacement is undone
    assert any("restored" in line for line in lines)


@pytest.mark.parametrize("fault", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_a_failed_export_removes_its_own_folder_and_lock(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    import specx.exporter.export as exporter
    from specx.exporter import ExportOptions, export_pair

    target = tiny_target(tokenizer, tmp_path / "t")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise fault

    monkeypatch.setattr(exporter, "check_graph", broken)
    with pytest.raises(type(fault)):
        export_pair(target, [], tmp_path / "out", ExportOptions(max_length=64), log=print)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]

"""scripts/diagnostics/check_parts.py: the export's parity check whole and in layer-range parts
on an int4 graph carried from a GGUF, run as a script."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import export_target_alone, needs_exporter

pytestmark = needs_exporter


def test_the_diagnostic_reports_identical_logits_and_each_ways_peak(tmp_path: Path) -> None:
    """scripts/diagnostics/check_parts.py, behind docs/performance.md's figures."""
    import subprocess
    import sys

    pytest.importorskip("gguf")
    from gguf_models import write_gguf

    source = write_gguf(tmp_path / "m.gguf", "qwen2", seed=0)
    export_target_alone(source, tmp_path / "a", precision="int4")
    script = Path(__file__).resolve().parents[2] / "scripts/diagnostics/check_parts.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "a"), "--part-mb", "0.1", "--text", "9"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| whole")]
    parts = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| parts")]
    assert rows[0][2].strip() == "1" and int(parts[0][2]) > 1
    assert "logits identical: yes" in done.stdout

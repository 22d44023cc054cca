"""scripts/diagnostics/kernel_costs.py measures what it says on small inputs: one product per
row count, and an artifact's passes with r, c and peak memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kernel_tools import kernels_path

pytest.importorskip("gguf")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "diagnostics" / "kernel_costs.py"


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_matmul_reports_a_time_and_a_fraction_of_the_measured_peak_per_row_count() -> None:
    kernels_path()
    out = run(
        "matmul", "--type", "Q6_K", "--n", "64", "--k", "512", "--rows", "1,3", "--repeats", "2"
    )
    peak, *lines = out.strip().splitlines()
    assert peak.startswith("peak of ") and "G multiply-adds/s" in peak
    assert float(peak.split(": ")[1].split()[0]) > 0
    assert [line.split(" x ")[1].split(" rows")[0] for line in lines] == ["1", "3"]
    for line in lines:
        assert "GB/s of weights" in line and line.endswith("of the peak")
        assert 0 < int(line.rsplit("= ", 1)[1].split("%")[0]) <= 100  # a kernel under its peak


def test_passes_reports_r_c_and_memory_of_a_pair(tmp_path: Path) -> None:
    from specx.exporter import ExportOptions, export_pair
    from tests.gguf_models import write_gguf

    kernels_path()
    target = write_gguf(tmp_path / "t.gguf", "qwen2", seed=0)
    draft = write_gguf(tmp_path / "d.gguf", "qwen2", seed=0, redraw=("blk.1.ffn_down.weight",))
    options = ExportOptions(max_length=256, precision="int4", kernels="specx")
    export_pair(str(target), [str(draft)], tmp_path / "art", options, lambda _m: None)
    out = run("passes", str(tmp_path / "art"), "--rounds", "2", "--prompt", "40")
    for key in ("target_ms", "r_k3", "r_k5", "r_k8", "draft_ms", "c", "peak_rss_mb"):
        assert f"{key} " in out
    for key in ("target_prompt_tps", "draft_prompt_tps"):
        assert float(out.split(f"{key} ")[1].split(",")[0]) > 0


def test_compare_kernels_times_each_library_on_the_same_products() -> None:
    script = SCRIPT.parent / "compare_kernels.py"
    lib = kernels_path()
    done = subprocess.run(
        [sys.executable, str(script), f"a={lib},b={lib}", "Q4_K:64:512,Q8_0:32:256", "1,3",
         "--repeats", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("Q4_K [64, 512] x 1 rows: a ")
    assert all(" ms (1.00x)  b " in line for line in lines)

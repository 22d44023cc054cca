"""scripts/diagnostics/head_acceptance.py on the head `specx distill` trains in
tests/conftest.py's `distilled`: the bench's prompts scored offline, and the held-out report's
figures from the head's stored data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_exporter

pytestmark = needs_exporter


def test_head_acceptance_script_measures_the_bench_prompts_as_the_held_out_report_does(
    distilled: dict[str, Any],
) -> None:
    """scripts/diagnostics/head_acceptance.py: the target answers the bench's prompts and the
    head's chains are scored on them; on the head's stored held-out data it gives the report's
    figures."""
    import importlib.util

    path = Path(__file__).parents[2] / "scripts" / "diagnostics" / "head_acceptance.py"
    spec = importlib.util.spec_from_file_location("head_acceptance", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    lines: list[str] = []
    got = script.measure(
        str(distilled["source"]), distilled["head"], ["chat", "code"], 12, 3, True, lines.append
    )
    assert {"chat", "code", "stored held-out", "stored templated"} <= set(got)
    assert len(lines) == len(got)
    for figures in got.values():
        assert len(figures["acceptance"]) == 3
        assert all(0.0 <= a <= 1.0 for a in figures["acceptance"])
        assert 1.0 <= figures["tokens_per_pass"]["1"] <= figures["tokens_per_pass"]["3"] <= 4.0
        assert figures["answer_tokens"] > 0
    assert got["chat"]["answer_tokens"] <= 5 * 12
    report = json.loads((distilled["head"] / "distill_report.json").read_text())
    want = [round(a, 3) for a in report["held_out_acceptance"]]
    assert got["stored held-out"]["acceptance"] == pytest.approx(want, abs=1e-3)

"""scripts/diagnostics/same_tokens.py compare: the same tokens and passes, or exit 1; a -k auto
token difference is a note only where the record shows passes that differ by width."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import load_script


def _write(path: Path, digests: dict[str, str], passes: int = 10) -> Path:
    rows = [
        {
            "workload": "alone",
            "config": config,
            "repeat": 0,
            "prompt": 0,
            "tokens": 8,
            "target_passes": passes,
            "token_digest": digest,
        }
        for config, digest in digests.items()
    ]
    path.write_text(json.dumps({"records": rows}))
    return path


def _compare(tmp_path: Path, before: dict[str, str], after: dict[str, str], **kw: Any) -> int:
    script = load_script("same_tokens")
    a = _write(tmp_path / "a.json", before)
    b = _write(tmp_path / "b.json", after, **kw)
    return int(script.compare(a, b))


def test_identical_records_compare_equal_and_moved_passes_at_fixed_k_do_not(
    tmp_path: Path,
) -> None:
    runs = {"target": "t", "d K=1": "t", "d K=auto": "t"}
    assert _compare(tmp_path, runs, runs) == 0
    assert _compare(tmp_path, runs, runs, passes=11) == 1  # fixed K: passes must agree


def test_auto_tokens_may_move_only_where_fixed_k_runs_show_width_dependent_passes(
    tmp_path: Path,
) -> None:
    exact = {"target": "t", "d K=1": "t", "d K=auto": "t"}
    assert _compare(tmp_path, exact, {**exact, "d K=auto": "x"}) == 1
    parted = {"target": "t", "d K=1": "u", "d K=auto": "t"}
    assert _compare(tmp_path, parted, {**parted, "d K=auto": "x"}) == 0
    assert _compare(tmp_path, parted, {**parted, "d K=1": "x"}) == 1  # fixed K never

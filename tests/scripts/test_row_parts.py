"""scripts/diagnostics/row_parts.py: every node's rows of a verify pass compared with one-token
passes; an origin is a node that parts while what it reads agrees."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import load_script, needs_exporter


def test_a_row_is_cut_from_the_verify_pass_along_seq_and_the_keys() -> None:
    script = load_script("row_parts")
    b = np.arange(2 * 5 * 9, dtype=np.float32).reshape(2, 5, 9)  # [heads, k + 1, keys]
    a = b[:, 2:3, :7]  # row 2 saw 7 keys (start 4 + 2 + 1)
    part = script.row(a, b, 2, 5, a_len=7, b_len=9)
    assert part is not None and np.array_equal(part, a)
    assert script.row(a[:, :, :6], b, 2, 5, a_len=7, b_len=9) is None  # no axis explains it


def test_the_origin_is_the_first_node_that_parts_not_the_ones_that_carry_it() -> None:
    script = load_script("row_parts")
    producer = {
        "x": ("MatMul", ["input", "w"]),
        "y": ("Add", ["x", "bias"]),
        "z": ("Softmax", ["y"]),
        "shape": ("Shape", ["x"]),
    }
    diffs = {"x": 0.0, "y": 1e-7, "z": 3e-8, "shape": None}
    assert script.origins(diffs, producer) == ["y"]
    assert script.origins({**diffs, "y": 0.0, "z": 0.0}, producer) == []


def test_compare_finds_a_changed_row_and_passes_equal_ones() -> None:
    script = load_script("row_parts")
    rng = np.random.default_rng(0)
    b = {"h": rng.standard_normal((1, 3, 4)).astype(np.float32), "ids": np.zeros((1, 3), np.int64)}
    a = [{"h": b["h"][:, j : j + 1].copy(), "ids": np.zeros((1, 1), np.int64)} for j in range(3)]
    assert script.compare(a, b, ["h", "ids"], start=5) == {"h": 0.0, "ids": None}
    a[1]["h"][0, 0, 2] = np.nextafter(a[1]["h"][0, 0, 2], np.float32(9))  # one ulp, one row
    assert script.compare(a, b, ["h", "ids"], start=5)["h"] > 0


@needs_exporter
@pytest.mark.parametrize("fixture", ["llama_pair", "llama_plain_pair"])
def test_the_script_compares_every_node_of_a_real_graph_and_explains_what_parts(
    fixture: str, request: Any
) -> None:
    pair = request.getfixturevalue(fixture)
    report = load_script("row_parts").measure(pair.artifact, k=3, prompt="hello world", starts=2)
    for result in report["passes"]:
        assert result["tensors"] > 50 and result["skipped"] < result["tensors"]
        if result["tapped_logits_max_abs_diff"]:  # logits part: some node started it
            assert result["origins"] and result["parted"] >= len(result["origins"])
        else:
            assert result["parted"] == 0 or result["origins"]

"""Drafts derived from the target at export: int8 and int4 weight-quantized copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest


@pytest.fixture(scope="session")
def quantized_pair(tmp_path_factory: Any, llama_pair: TinyPair) -> Path:
    from specx.exporter import ExportOptions, export_pair

    out = tmp_path_factory.mktemp("quantized") / "artifact"
    export_pair(
        str(llama_pair.sources["target"]),
        ["ngram+int8", "int4", "ngram"],
        out,
        ExportOptions(max_length=128),
        log=lambda _m: None,
    )
    return out


@needs_exporter
def test_quantized_drafts_are_exported_checked_and_keep_greedy_equality(
    quantized_pair: Path, llama_pair: TinyPair
) -> None:
    manifest = Manifest.read(quantized_pair)
    assert [d.name for d in manifest.drafts] == ["int8", "int4"]
    assert manifest.default_drafter == "ngram+int8"
    target_bytes = manifest.target.weight_bytes
    for spec in manifest.drafts:
        assert spec.parity["kind"] == "quantized"
        assert 0.2 <= spec.parity["argmax_agreement"] <= 1.0
        assert spec.weight_bytes < target_bytes
    pipe = Pipeline.load(quantized_pair)
    prompt = np.array([20, 30, 40, 50, 60], dtype=np.int64)
    want = pipe.generate(prompt, max_new_tokens=40, k=0).token_ids
    for name in ("int8", "int4", "ngram", "ngram+int8", "ngram+int4"):
        result = pipe.generate(prompt, max_new_tokens=40, k=3, drafter=name)
        assert result.token_ids == want, name
    assert pipe.default_drafter == "ngram+int8"
    assert pipe.generate(prompt, max_new_tokens=40, k=3, drafter="int8").stats.accepted > 0

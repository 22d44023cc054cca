"""The second real model, Gemma 3 270M (GGUF Q4_K_M, assembled from PyPI chunk packages by
scripts/fetch_gemma3.sh): sliding-window layers with local rotary, global layers, per-head query
and key norms, sandwich norms, a 262k vocabulary and a tied head, end to end.

Runs when SPECX_GEMMA3_GGUF points at the .gguf file (scripts/test.sh fetches it); skipped
otherwise. Exports the target with its derived int8 draft, checks parity, and checks that greedy
output on real chat prompts equals transformers' greedy output on the model as loaded from the
GGUF file, for the target alone and with each drafter. (This GGUF is the pretrained model: it
carries no chat template, so the prompts are plain text.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scratch import fixture_dir

from conftest import needs_exporter
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest

GGUF = os.environ.get("SPECX_GEMMA3_GGUF", "")
pytestmark = [
    needs_exporter,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(GGUF).is_file(), reason="SPECX_GEMMA3_GGUF is not set"),
]
PROMPTS = [
    "The sea is a vast body of salt water that",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]


@pytest.fixture(scope="module")
def gemma3(request: Any, tmp_path_factory: Any) -> Path:
    from specx.exporter import ExportOptions, export_pair

    out = fixture_dir(request, tmp_path_factory, "gemma3") / "artifact"
    export_pair(GGUF, ["ngram+int8"], out, ExportOptions(max_length=512), log=print)
    return out


def test_gemma3_exports_with_its_layer_types_and_tight_parity(gemma3: Path) -> None:
    manifest = Manifest.read(gemma3)
    target = manifest.target
    assert target.architecture == "gemma3_text" and target.num_layers == 18
    assert target.head_dim == 256 and target.num_heads * target.head_dim != target.hidden_size
    assert target.attention == "gqa" and target.parity["passed"]
    assert manifest.find_draft("int8").parity["argmax_agreement"] > 0.3
    assert manifest.default_drafter == "ngram+int8"


def test_gemma3_greedy_equals_transformers_for_every_drafter(gemma3: Path) -> None:
    import torch

    from reference import assert_same_or_near_tie, hf_greedy
    from specx.exporter.weights.load import load_source

    pipe = Pipeline.load(gemma3)
    eos = pipe.manifest.special_tokens.eos_token_ids
    torch.set_num_threads(os.cpu_count() or 1)
    source = load_source(GGUF, print).model
    for text in PROMPTS:
        prompt = pipe.encode_prompt(text)
        alone = pipe.generate(prompt, max_new_tokens=40, k=0)
        for name, k in (("int8", 3), ("ngram", 4), ("ngram+int8", 3)):
            result = pipe.generate(prompt, max_new_tokens=40, k=k, drafter=name)
            assert result.token_ids == alone.token_ids, (text, name)
        want = hf_greedy(source, np.asarray(prompt), len(alone.token_ids), eos)
        assert_same_or_near_tie(source, np.asarray(prompt), alone.token_ids, want)
    auto = pipe.generate(PROMPTS[1], max_new_tokens=40, k="auto")
    assert auto.stats.accepted > 0

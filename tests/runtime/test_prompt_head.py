"""A prompt's chunks compute the LM head on their last row only (contract.KEEP_LOGITS):
exported gqa graphs take `logits_to_keep`; prefill asks for one row, every other pass for all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest
from specx.runtime.backends import OrtSession

pytestmark = needs_exporter

TOKENS = np.arange(5, 17, dtype=np.int64)  # 12 prompt tokens


def _target(artifact: Path, chunk: int = 16) -> OrtSession:
    spec = Manifest.read(artifact).target
    return OrtSession(artifact / spec.graph, spec, ["cpu"], max_chunk=chunk)


def _raw_logits(artifact: Path, keep: int) -> np.ndarray:
    """The target graph run by ONNX Runtime alone on TOKENS with `logits_to_keep` = keep."""
    import onnxruntime as ort

    spec = Manifest.read(artifact).target
    options = ort.SessionOptions()
    if spec.op_libraries:  # the specx kernels
        from kernel_tools import kernels_path

        options.register_custom_ops_library(kernels_path())
    path = str(artifact / spec.graph)
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    seq = len(TOKENS)
    feed: dict[str, np.ndarray] = {
        contract.INPUT_IDS: TOKENS[None],
        contract.SEQLENS_K: np.array([seq - 1], np.int32),
        contract.TOTAL_SEQUENCE_LENGTH: np.array(seq, np.int32),
        contract.KEEP_LOGITS: np.array(keep, np.int64),
    }
    if spec.uses_position_ids:
        feed[contract.POSITION_IDS] = np.arange(seq, dtype=np.int64)[None]
    for i in range(spec.num_layers):
        for name in (contract.past_key(i), contract.past_value(i)):
            feed[name] = np.zeros((1, spec.kv_heads, 16, spec.head_dim), np.float32)
    return np.asarray(session.run([contract.LOGITS], feed)[0])


@pytest.mark.parametrize("fixture", ["llama_pair", "gpt2_gqa_pair"])
def test_an_exported_gqa_graph_returns_the_logits_of_its_last_rows_as_asked(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    artifact = request.getfixturevalue(fixture).artifact
    spec = Manifest.read(artifact).target
    assert spec.inputs[-1] == contract.TensorSpec(contract.KEEP_LOGITS, "int64", ())
    full = _raw_logits(artifact, len(TOKENS))  # [1, 12, vocab]
    two = _raw_logits(artifact, 2)
    assert full.shape == (1, 12, spec.vocab_size) and two.shape == (1, 2, spec.vocab_size)
    np.testing.assert_allclose(two[0], full[0, -2:], rtol=1e-5, atol=1e-5)
    # negative control: the rows are the last ones, not the first
    assert not np.allclose(two[0], full[0, :2], rtol=1e-5, atol=1e-5)


def test_prefill_reads_one_logits_row_a_chunk_and_leaves_the_cache_as_full_passes_do(
    llama_pair: TinyPair,
) -> None:
    session = _target(llama_pair.artifact, chunk=5)
    full_cache, prompt_cache = session.new_cache(32), session.new_cache(32)
    rows = [session.forward(TOKENS[i : i + 5], full_cache).copy() for i in range(0, 12, 5)]
    last = session.prefill(TOKENS, prompt_cache)  # chunks of 5, 5, 2: one row each
    assert last is not None and last.shape == (session.spec.vocab_size,)
    np.testing.assert_allclose(last, rows[-1][-1], rtol=1e-5, atol=1e-5)
    assert full_cache.length == prompt_cache.length == 12
    after_full = session.forward(TOKENS[:3], full_cache).copy()
    after_prompt = session.forward(TOKENS[:3], prompt_cache).copy()
    np.testing.assert_allclose(after_prompt, after_full, rtol=1e-5, atol=1e-5)


def test_a_graph_without_the_logits_count_still_prefills_with_every_row(
    llama_plain_pair: TinyPair,
) -> None:
    """Plain-attention graphs (the TensorRT ones) and graphs exported before the count: the
    prefill reads the last of all the rows."""
    session = _target(llama_plain_pair.artifact)
    assert contract.KEEP_LOGITS not in {t.name for t in session.spec.inputs}
    cache, other = session.new_cache(32), session.new_cache(32)
    full = session.forward(TOKENS, cache).copy()
    last = session.prefill(TOKENS, other)
    assert last is not None
    np.testing.assert_array_equal(last, full[-1])


@pytest.fixture(scope="module")
def kernel_artifact(tmp_path_factory: Any) -> Path:
    """A tiny qwen2 target as int4 GGUF blocks on the specx kernels."""
    from kernel_tools import export_qwen2_int4

    folder = tmp_path_factory.mktemp("prompt-head")
    return export_qwen2_int4(folder, seed=3, draft=False, batched=False, max_length=64)


def test_on_the_specx_kernels_the_last_row_alone_has_the_full_pass_bits(
    kernel_artifact: Path,
) -> None:
    session = _target(kernel_artifact)
    full = session.forward(TOKENS, session.new_cache(32)).copy()
    one = session.forward_last(TOKENS, session.new_cache(32)).copy()
    assert one.tobytes() == full[-1].tobytes()
    two = _raw_logits(kernel_artifact, 2)
    assert two[0].tobytes() == full[-2:].tobytes()

"""The real GGUF models on specx's own kernels (`--kernels specx`): SmolLM2 (Llama, Q4_1 / Q8_0),
Gemma 3 270M (sliding-window and global layers, Q4_K / Q5_0 / Q6_K / Q8_0) and the Qwen2.5-Coder
1.5B target (Q4_K / Q6_K): matmuls, embedding and attention all on the library, each verify
row's logits the one-token pass's bits, and greedy speculation the target alone's tokens for
every K with no near-tie allowance.

Each runs when its file's variable is set (scripts/test.sh fetches them); skipped otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kernel_tools import kernels_path
from scratch import fixture_dir

from conftest import needs_exporter
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest

MODELS = {
    "smollm2": "SPECX_SMOLLM2_GGUF",
    "gemma3": "SPECX_GEMMA3_GGUF",
    "qwen": "SPECX_QWEN_TARGET",
}
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
pytestmark = [needs_exporter, pytest.mark.slow]


def _source(name: str) -> str:
    path = os.environ.get(MODELS[name], "")
    if name == "qwen" and os.environ.get("SPECX_SKIP_QWEN"):
        pytest.skip("SPECX_SKIP_QWEN is set")
    if not Path(path).is_file():
        pytest.skip(f"{MODELS[name]} is not set (scripts/test.sh fetches the real models)")
    return path


@pytest.fixture(scope="module", params=sorted(MODELS))
def artifact(request: Any, tmp_path_factory: Any) -> Path:
    from specx.exporter import ExportOptions, export_pair

    source = _source(request.param)
    kernels_path()  # skipped (or failed, where the test command requires it) without the library
    out = fixture_dir(request, tmp_path_factory, request.param) / "artifact"
    options = ExportOptions(max_length=256, precision="int4", kernels="specx")
    export_pair(source, ["ngram"], out, options, log=print)
    return out


def test_every_op_runs_on_the_kernels_and_passes_agree_bit_for_bit(artifact: Path) -> None:
    target = Manifest.read(artifact).target
    ops = set(target.operators)
    assert {"specx:GgufMatMul", "specx:GgufGather", "specx:GroupQueryAttention"} <= ops
    assert not any(op.startswith("com.microsoft:") for op in ops)
    calibration = target.parity["calibration"]
    assert calibration["passes_parted"] == 0
    assert calibration["passes_max_abs_logit_diff"] == 0.0

    session = Pipeline.load(artifact).target.fork()
    ids = np.arange(100, 114, dtype=np.int64)
    one = session.new_cache(64)
    rows = np.concatenate([session.forward(ids[i : i + 1], one).copy() for i in range(len(ids))])
    for k in (3, 8):
        cache = session.new_cache(64)
        head = session.forward(ids[:4], cache).copy()  # a prompt, then a verify pass of K + 1
        wide = session.forward(ids[4 : k + 5], cache).copy()
        got = np.concatenate([head, wide])
        assert np.array_equal(got.view(np.uint32), rows[: k + 5].view(np.uint32)), k


def test_greedy_speculation_is_the_target_alone_for_every_k(artifact: Path) -> None:
    pipe = Pipeline.load(artifact)
    prompt = pipe.encode_prompt(PROMPT)
    alone = pipe.generate(prompt, max_new_tokens=32, k=0)
    for k in (1, 4, 8, "auto"):
        result = pipe.generate(prompt, max_new_tokens=32, k=k, drafter="ngram")
        assert result.token_ids == alone.token_ids, k

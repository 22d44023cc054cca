"""GPU and TensorRT paths. Marked: they skip cleanly on machines without CUDA or TensorRT and run
from scripts/gpu_check.sh where a GPU is available."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest

pytestmark = needs_exporter


@pytest.mark.gpu
def test_the_cuda_provider_gives_the_same_greedy_tokens_with_and_without_drafts(
    llama_plain_pair: TinyPair,
) -> None:
    # plain graphs: GroupQueryAttention has CUDA kernels for fp16/bf16 only
    llama_pair = llama_plain_pair
    pipe = Pipeline.load(llama_pair.artifact, providers=["cuda"])
    assert pipe.target.device == "cuda"
    prompt = np.array([10, 20, 30, 40], dtype=np.int64)
    alone = pipe.generate(prompt, max_new_tokens=48, k=0).token_ids
    for drafter in ("self", "mixed", "ngram"):
        assert pipe.generate(prompt, max_new_tokens=48, k=4, drafter=drafter).token_ids == alone
    cpu = Pipeline.load(llama_pair.artifact).generate(prompt, max_new_tokens=48, k=0).token_ids
    assert cpu[:16] == alone[:16]  # different kernels: allow late near-ties, not early ones


@pytest.mark.gpu
def test_cuda_caches_stay_on_the_device_and_are_written_in_place(
    llama_plain_pair: TinyPair,
) -> None:
    from specx.runtime.backends import OrtSession

    llama_pair = llama_plain_pair
    manifest = Manifest.read(llama_pair.artifact)
    session = OrtSession(llama_pair.artifact / "target.onnx", manifest.target, ["cuda"])
    cache = session.new_cache(64)
    addresses = cache.buffer_addresses()
    session.forward(np.array([5, 6, 7]), cache)
    first = cache.keys(0).copy()
    session.forward(np.array([8]), cache)
    assert cache.buffer_addresses() == addresses
    np.testing.assert_array_equal(cache.keys(0)[:3], first)


@pytest.mark.gpu
def test_fp16_graphs_run_on_cuda_with_exact_speculation(request: pytest.FixtureRequest) -> None:
    pair: TinyPair = request.getfixturevalue("fp16_pair")
    pipe = Pipeline.load(pair.artifact, providers=["cuda"])
    prompt = np.array([10, 20, 30, 40], dtype=np.int64)
    alone = pipe.generate(prompt, max_new_tokens=40, k=0).token_ids
    assert pipe.generate(prompt, max_new_tokens=40, k=4, drafter="mixed").token_ids == alone


@pytest.fixture(scope="session")
def engine_pair(tmp_path_factory: Any, request: pytest.FixtureRequest) -> Path:
    from profile_tools import mutated, to_toml
    from specx.exporter import ExportOptions, export_pair

    pair: TinyPair = request.getfixturevalue("fp16_pair")
    root = tmp_path_factory.mktemp("engines")
    data = mutated("gpu-datacenter", lambda d: None)
    data.update(max_context=256, prefill_chunk=64)
    data["tensorrt"]["prefill"].update(seq=[1, 64, 64], past_len=[0, 0, 192])
    data["tensorrt"]["decode"].update(past_len=[0, 64, 247])
    data["tensorrt"]["workspace_mb"] = 1024
    profile = root / "gpu-small.toml"
    profile.write_text(to_toml(data))
    out = root / "artifact"
    export_pair(
        str(pair.sources["target"]),
        [f"mixed={pair.sources['mixed']}"],
        out,
        ExportOptions(profile=str(profile), engines=True),
        log=print,
    )
    return out


@pytest.mark.tensorrt
def test_tensorrt_engines_are_recorded_and_run_exact_speculation(engine_pair: Path) -> None:
    manifest = Manifest.read(engine_pair)
    assert {e["model"] for e in manifest.engines} == {"target", "mixed"}
    for entry in manifest.engines:
        assert entry["tensorrt"] and entry["compute_capability"] and entry["profile"]
        assert (engine_pair / entry["file"]).is_file()
    pipe = Pipeline.load(engine_pair)  # the profile puts tensorrt first
    assert pipe.providers[0] == "tensorrt"
    prompt = np.array([10, 20, 30, 40], dtype=np.int64)
    alone = pipe.generate(prompt, max_new_tokens=60, k=0).token_ids
    assert pipe.generate(prompt, max_new_tokens=60, k=4, drafter="mixed").token_ids == alone
    long_prompt = np.arange(10, 150, dtype=np.int64)  # > one decode-profile pass: prefill profile
    assert len(pipe.generate(long_prompt, max_new_tokens=20, k=3, drafter="mixed").token_ids) > 0


@pytest.mark.tensorrt
def test_a_rebuild_refreshes_the_engines_in_place(engine_pair: Path) -> None:
    from specx.exporter.tensorrt.engines import rebuild_engines

    before = Manifest.read(engine_pair).engines
    after = rebuild_engines(engine_pair, None, log=print).engines
    assert [e["file"] for e in after] == [e["file"] for e in before]
    assert all(a["built"] >= b["built"] for a, b in zip(after, before, strict=True))

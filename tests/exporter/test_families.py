"""The 2026 model families: Qwen3, Gemma 3, Phi-3/Phi-4-mini, SmolLM3, Granite, OLMo2 (and
Mistral's sliding window), each a tiny random model exercising what sets it apart (see
tests/tiny_models.py FEATURES: several layer types, sliding windows shorter than prompt plus
generation, head_dim != hidden / heads, grouped and full multi-head attention, partial rotary,
NoPE layers, norms on queries and keys, sandwich and post norms, multipliers, soft-capping, tied
and untied heads). Each is exported in both attention variants, checked for parity at export,
and must decode greedily, speculatively with a draft model and with the hybrid, exactly as
transformers' own greedy `generate` (up to float near-ties, tests/reference.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import Pipeline

pytestmark = needs_exporter

FAMILIES = ["qwen3", "gemma3", "phi3", "smollm3", "granite", "olmo2", "mistral-window"]


def build(arch: str, vocab: int, seed: int) -> Any:
    import tiny_models

    if arch == "mistral-window":  # one window for every layer, shorter than the prompts
        saved = tiny_models.FEATURES["mistral"]
        tiny_models.FEATURES["mistral"] = {"sliding_window": 7}
        try:
            return tiny_models.build_model("mistral", vocab, seed)
        finally:
            tiny_models.FEATURES["mistral"] = saved
    return tiny_models.build_model(arch, vocab, seed)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: Any, tokenizer: Any) -> dict[tuple[str, str], tuple[Path, Any]]:
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    out = {}
    root = tmp_path_factory.mktemp("families")
    vocab = tokenizer.get_vocab_size()
    for arch in FAMILIES:
        target = build(arch, vocab, seed=1)
        draft = tiny_models.perturbed_copy(target, 0.02, seed=7)
        src = tiny_models.save(target, tokenizer, root / f"{arch}-target")
        dsrc = tiny_models.save(draft, tokenizer, root / f"{arch}-draft")
        for attention in ("gqa", "plain"):
            artifact = root / f"{arch}-{attention}"
            export_pair(
                str(src),
                [f"mixed={dsrc}"],
                artifact,
                ExportOptions(max_length=96, attention=attention),
                log=lambda _m: None,
            )
            out[(arch, attention)] = (artifact, target)
    return out


@pytest.mark.parametrize("attention", ["gqa", "plain"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_the_family_decodes_exactly_as_transformers(
    exported: dict[tuple[str, str], tuple[Path, Any]], arch: str, attention: str
) -> None:
    artifact, target = exported[(arch, attention)]
    pipe = Pipeline.load(artifact)
    spec = pipe.manifest.target
    assert spec.attention == attention and spec.parity["passed"]
    eos = pipe.manifest.special_tokens.eos_token_ids
    rng = np.random.default_rng(len(arch))
    for length in (2, 14):  # the longer prompt alone outgrows every sliding window
        prompt = rng.integers(3, 300, size=length).astype(np.int64)
        want = hf_greedy(target, prompt, 36, eos)
        for k, drafter in ((0, "none"), (1, "mixed"), (4, "mixed"), (3, "ngram+mixed")):
            got = pipe.generate(prompt, max_new_tokens=36, k=k, drafter=drafter).token_ids
            assert_same_or_near_tie(target, prompt, got, want)


def test_windowed_layers_and_their_sizes_reach_the_graph(
    exported: dict[tuple[str, str], tuple[Path, Any]],
) -> None:
    import onnx

    artifact, _target = exported[("gemma3", "gqa")]
    graph = onnx.load(str(artifact / "target.onnx"), load_external_data=False)
    windows = [
        next(a.i for a in node.attribute if a.name == "local_window_size")
        for node in graph.graph.node
        if node.op_type == "GroupQueryAttention"
    ]
    assert windows == [5, 5, -1]  # sliding, sliding, full (tests/tiny_models.py)


def test_the_memory_planner_counts_every_family(tmp_path: Path, tokenizer: Any) -> None:
    import tiny_models
    from specx.exporter.architecture import describe
    from specx.exporter.planning.profile import read_config

    for arch in FAMILIES:
        model = build(arch, tokenizer.get_vocab_size(), seed=1)
        folder = tiny_models.save(model, tokenizer, tmp_path / arch)
        shape = describe(read_config(str(folder))).model_shape(arch)
        real = sum(p.numel() for p in model.parameters())
        assert abs(shape.num_parameters - real) <= 0.05 * real, (arch, shape.num_parameters, real)
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        assert shape.head_dim == head_dim, arch


def test_a_partial_rotary_width_gqa_cannot_take_falls_back_to_plain(
    tmp_path: Path, tokenizer: Any
) -> None:
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    saved = dict(tiny_models.FEATURES["phi3"])
    tiny_models.FEATURES["phi3"].update(num_attention_heads=4, num_key_value_heads=4)
    try:  # head_dim 16, half of it rotated: a rotary table 4 wide, GQA wants multiples of 8
        model = tiny_models.build_model("phi3", tokenizer.get_vocab_size(), seed=3)
    finally:
        tiny_models.FEATURES["phi3"] = saved
    src = tiny_models.save(model, tokenizer, tmp_path / "phi")
    lines: list[str] = []
    export_pair(str(src), [], tmp_path / "out", ExportOptions(max_length=64), log=lines.append)
    assert any("turns 8 of 16 dims" in line and "plain" in line for line in lines), lines
    assert Pipeline.load(tmp_path / "out").manifest.target.attention == "plain"

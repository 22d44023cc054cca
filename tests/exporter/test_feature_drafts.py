"""Feature drafts (EAGLE-style heads): imported from the EAGLE authors' and vLLM speculators'
layouts, exported beside a target that returns its hidden states, and run behind the drafter
seam. The heads here are random: their proposals are rarely accepted, which is what exactness
has to survive; tests/exporter/test_distill.py trains one that is accepted often."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import Pipeline
from specx.runtime.errors import ExportError
from specx.runtime.settings import GenerationSettings

pytestmark = needs_exporter

LAYOUTS = ("eagle_authors_v1", "eagle_authors_v3", "speculators_eagle", "speculators_eagle3")
PROMPTS = ["The cat is sitting on the mat.", "def add(a, b):", "One, two, three, four,"]
TARGET_LAYERS = 6


@pytest.fixture(scope="module")
def target(tmp_path_factory: Any, tokenizer: Any) -> tuple[Any, Path]:
    import tiny_models

    root = tmp_path_factory.mktemp("heads")
    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1, layers=6)
    return model, tiny_models.save(model, tokenizer, root / "target")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: Any, target: tuple[Any, Path]) -> dict[str, tuple[Path, Path]]:
    """layout -> (head checkpoint, artifact); the speculators EAGLE-3 one with a batched graph."""
    import head_checkpoints
    from specx.exporter import ExportOptions, export_pair

    model, source = target
    root = tmp_path_factory.mktemp("head-artifacts")
    out = {}
    for seed, layout in enumerate(LAYOUTS):
        head = head_checkpoints.write_head(layout, root / layout, model, seed=seed)
        artifact = root / f"{layout}-artifact"
        export_pair(
            str(source),
            [str(head), "ngram"],
            artifact,
            ExportOptions(max_length=256, batched=layout == "speculators_eagle3"),
            log=lambda _m: None,
        )
        out[layout] = (head, artifact)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_head_checkpoint_exports_as_a_feature_draft_that_the_manifest_describes(
    artifacts: dict[str, tuple[Path, Path]], layout: str
) -> None:
    _, artifact = artifacts[layout]
    pipe = Pipeline.load(artifact)
    manifest = pipe.manifest
    (spec,) = manifest.drafts
    assert spec.name == "eagle" and spec.head is not None
    assert spec.head.kind == (
        "eagle3" if layout.endswith("v3") or layout.endswith("3") else "eagle"
    )
    assert spec.head.layout == ("speculators" if layout.startswith("speculators") else "eagle")
    if spec.head.kind == "eagle":  # the target's final normed hidden state
        assert manifest.target.feature_layers == (TARGET_LAYERS,)
        assert spec.head.draft_vocab_size == manifest.target.vocab_size
    else:  # three layers: the authors' default (2, L // 2, L - 3), or the config's own list
        want = (2, 3, 3) if layout == "eagle_authors_v3" else (1, 3, 5)
        assert manifest.target.feature_layers == want
        assert spec.head.draft_vocab_size == manifest.target.vocab_size // 2
    assert manifest.target.feature_size == len(spec.head.feature_layers) * 64
    assert manifest.target.parity["max_feature_diff"] < 1e-3  # vs transformers' hidden states
    assert spec.parity["passed"] and spec.parity["max_abs_logit_diff"] <= spec.parity["tolerance"]
    assert pipe.drafter_names == ["eagle", "ngram", "suffix", "ngram+eagle", "suffix+eagle", "none"]
    # a version-1 reader would run the head as a model (2); its gqa graphs take the logits count
    assert manifest.format_version == 4


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_exported_head_computes_what_its_layout_defines(
    artifacts: dict[str, tuple[Path, Path]], target: tuple[Any, Path], layout: str
) -> None:
    """The head graph's logits over pairs (target feature at t, token t + 1) against the
    layout's formulas applied to the checkpoint's raw tensors (tests/head_checkpoints.py)."""
    import head_checkpoints
    from specx.runtime.backends import OrtSession

    model, _ = target
    head_folder, artifact = artifacts[layout]
    manifest = Pipeline.load(artifact).manifest
    ids = np.random.default_rng(0).integers(3, 300, size=10).astype(np.int64)
    tsession = OrtSession(artifact / "target.onnx", manifest.target, ["cpu"])
    tsession.forward(ids, tsession.new_cache(16))
    assert tsession.last_features is not None
    features = tsession.last_features.copy()  # [10, F]
    spec = manifest.drafts[0]
    hsession = OrtSession(artifact / spec.graph, spec, ["cpu"])
    got, _ = hsession.forward_head(ids[1:], features[:-1], None, hsession.new_cache(16))
    want = head_checkpoints.reference_logits(layout, head_folder, model, ids[1:], features[:-1])
    assert np.array_equal(np.isfinite(got), np.isfinite(want))  # the reduced vocabulary
    finite = np.isfinite(want)
    assert np.max(np.abs(got[finite] - want[finite])) < 1e-3 * max(1.0, np.abs(want[finite]).max())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("drafter", "k"), [("eagle", 1), ("eagle", 4), ("ngram+eagle", 3)])
def test_greedy_with_a_feature_draft_is_transformers_greedy(
    artifacts: dict[str, tuple[Path, Path]],
    target: tuple[Any, Path],
    layout: str,
    drafter: str,
    k: int,
) -> None:
    model, _ = target
    pipe = Pipeline.load(artifacts[layout][1])
    eos = pipe.manifest.special_tokens.eos_token_ids
    for prompt in PROMPTS:
        ids = pipe.encode_prompt(prompt)
        got = pipe.generate(prompt, GenerationSettings(max_new_tokens=30, drafter=drafter, k=k))
        assert_same_or_near_tie(model, ids, got.token_ids, hf_greedy(model, ids, 30, eos))
        assert got.stats.target_passes <= 30 and got.stats.drafter == drafter


def test_a_one_token_prompt_drafts_once_the_target_has_read_it(
    artifacts: dict[str, tuple[Path, Path]], target: tuple[Any, Path]
) -> None:
    """Before the target's first pass there is no feature to read: that step is a plain one."""
    model, _ = target
    pipe = Pipeline.load(artifacts["speculators_eagle3"][1])
    ids = np.array([5], dtype=np.int64)
    got = pipe.generate(ids, GenerationSettings(max_new_tokens=12, drafter="eagle", k=3))
    eos = pipe.manifest.special_tokens.eos_token_ids
    assert_same_or_near_tie(model, ids, got.token_ids, hf_greedy(model, ids, 12, eos))
    assert got.stats.proposed > 0


def test_a_seed_gives_the_same_text_with_a_feature_draft_for_every_k(
    artifacts: dict[str, tuple[Path, Path]],
) -> None:
    """Invariant verification (the default); rejection verification is exact in distribution
    but its text depends on the draft (docs/sampling.md)."""
    pipe = Pipeline.load(artifacts["speculators_eagle3"][1])
    for prompt in PROMPTS:
        texts = {
            str(k): pipe.generate(
                prompt,
                max_new_tokens=24,
                drafter="none" if k == 0 else "eagle",
                k=k,
                temperature=1.5,
                seed=7,
            ).token_ids
            for k in (0, 1, 3, "auto")
        }
        assert len({tuple(t) for t in texts.values()}) == 1, texts


def test_feature_drafts_decode_exactly_in_a_batch(
    artifacts: dict[str, tuple[Path, Path]], target: tuple[Any, Path]
) -> None:
    model, _ = target
    pipe = Pipeline.load(artifacts["speculators_eagle3"][1])
    eos = pipe.manifest.special_tokens.eos_token_ids
    lengths = [20, 7, 26]
    settings = [
        GenerationSettings(max_new_tokens=n, drafter=d, k=3)
        for n, d in zip(lengths, ["eagle", "ngram+eagle", "eagle"], strict=True)
    ]
    results = pipe.generate_batch(PROMPTS, settings, max_batch=2)
    for prompt, n, result in zip(PROMPTS, lengths, results, strict=True):
        ids = pipe.encode_prompt(prompt)
        assert_same_or_near_tie(model, ids, result.token_ids, hf_greedy(model, ids, n, eos))
        assert result.stats.proposed > 0
    seeded = {"max_new_tokens": 20, "temperature": 2.0, "drafter": "eagle", "k": 2}
    alone = [pipe.generate(p, seed=3 + i, **seeded).token_ids for i, p in enumerate(PROMPTS)]
    mates = [GenerationSettings.of(None, seed=3 + i, **seeded) for i in range(len(PROMPTS))]
    assert [r.token_ids for r in pipe.generate_batch(PROMPTS, mates, max_batch=3)] == alone


def test_a_head_for_another_target_width_is_refused_with_the_reason(
    tmp_path: Path, tokenizer: Any, target: tuple[Any, Path]
) -> None:
    import head_checkpoints
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    model, source = target
    wider = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=4, hidden=96)
    head = head_checkpoints.write_head("speculators_eagle3", tmp_path / "head", wider)
    with pytest.raises(ExportError, match="hidden states of width 96"):
        export_pair(str(source), [str(head)], tmp_path / "out", ExportOptions(max_length=64))
    assert not (tmp_path / "out").exists()
    gpt2 = tiny_models.save(
        tiny_models.build_model("gpt2", tokenizer.get_vocab_size(), seed=1),
        tokenizer,
        tmp_path / "gpt2",
    )
    head = head_checkpoints.write_head("speculators_eagle", tmp_path / "head1", model)
    with pytest.raises(ExportError, match="Llama lineage"):
        export_pair(str(gpt2), [f"eagle={head}"], tmp_path / "out2", ExportOptions(max_length=64))


@pytest.mark.parametrize("layout", ["eagle_authors_v1", "speculators_eagle3"])
@pytest.mark.parametrize("drafter", ["eagle", "ngram+eagle"])
@pytest.mark.parametrize("sampled", [False, True])
def test_the_reference_consumer_runs_feature_drafts_as_specx_does(
    artifacts: dict[str, tuple[Path, Path]], layout: str, drafter: str, sampled: bool
) -> None:
    """reference/consumer.py (no specx import) reads the features output and drives the head
    from docs/artifact-format.md alone: same token ids and acceptance counts as specx."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "reference" / "consumer.py"
    spec = importlib.util.spec_from_file_location("reference_consumer_heads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    artifact = artifacts[layout][1]
    pipe = Pipeline.load(artifact)
    sampling = (
        {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 5} if sampled else None
    )
    rng = np.random.default_rng(3)
    for length in (1, 6, 140):  # 140: the catch-up after prefill spans two chunks
        prompt = rng.integers(3, 300, size=length).tolist()
        options: dict[str, Any] = dict(max_new_tokens=30, k=3, drafter=drafter, **(sampling or {}))
        want = pipe.generate(prompt, **options)
        got = module.generate(artifact, prompt, 30, drafter, 3, sampling)
        assert got["token_ids"] == want.token_ids, (length, got, want.token_ids)
        assert (got["proposed"], got["accepted"]) == (want.stats.proposed, want.stats.accepted)

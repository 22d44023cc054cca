"""The parity check in layer-range parts (exporter/checks/parts.py): the same passes, the same
logits to the bit, with one part's weights in ONNX Runtime at a time.

- For every family and both attention variants, for int4 graphs carried from a GGUF, for a
  target that returns features and for the batched graph: every pass of the check (prefill,
  decode, verify, a text one token and K + 1 tokens a pass) gives bit-identical logits whole and
  split into a part per layer.
- Negative control: a frontier tensor changed between two parts changes the logits, so the
  later parts read what the earlier ones computed.
- An export checked in parts records the same parity and calibration figures as one checked
  whole, and leaves no part files behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import export_target_alone, needs_exporter

pytestmark = needs_exporter

FAMILIES = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "phi3",
    "smollm3",
    "granite",
    "olmo2",
    "gpt2",
]
WHOLE = 1 << 40  # bytes: any test graph is checked whole
EACH_LEVEL = 1  # byte: every level (the embedding, each layer) is a part of its own


def _passes(vocab: int, k: int = 3) -> list[Any]:
    from specx.exporter.checks.parity import parity_passes, text_passes

    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=12 + k + 2).astype(np.int64)
    text = rng.integers(0, vocab, size=21).astype(np.int64)
    return parity_passes(ids, k) + text_passes(text, k)


def _assert_same_bits(folder: Path, spec: Any) -> int:
    from specx.exporter.checks.parity import run_passes

    passes = _passes(spec.vocab_size)
    whole, one = run_passes(folder, spec, passes, WHOLE)
    parted, parts = run_passes(folder, spec, passes, EACH_LEVEL)
    assert one == 1
    assert parts == spec.num_layers + 1  # the embedding's level and one per layer
    for step, w, p in zip(passes, whole, parted, strict=True):
        assert np.array_equal(w.logits, p.logits), f"stream {step.stream} at {step.start}"
        if w.features is not None or p.features is not None:
            assert np.array_equal(w.features, p.features)
    assert not list(folder.glob(".check-part*"))
    return parts


@pytest.mark.parametrize("attention", ["gqa", "plain"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_a_graph_checked_in_parts_gives_the_whole_graphs_logits_to_the_bit(
    arch: str, attention: str, tmp_path: Path, tokenizer: Any
) -> None:
    import tiny_models

    model = tiny_models.build_model(arch, tokenizer.get_vocab_size(), seed=1, layers=3)
    source = tiny_models.save(model, tokenizer, tmp_path / "src")
    manifest = export_target_alone(source, tmp_path / "a", attention=attention)
    _assert_same_bits(tmp_path / "a", manifest.target)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_an_int4_graph_carried_from_a_gguf_checked_in_parts_gives_the_same_bits(
    arch: str, tmp_path: Path
) -> None:
    pytest.importorskip("gguf")
    from gguf_models import write_gguf

    source = write_gguf(tmp_path / f"{arch}.gguf", arch, seed=0)
    manifest = export_target_alone(source, tmp_path / "a", precision="int4")
    assert manifest.target.variant == "int4"
    _assert_same_bits(tmp_path / "a", manifest.target)


def test_features_and_the_batched_graph_checked_in_parts_give_the_same_bits(
    tmp_path: Path, tokenizer: Any
) -> None:
    import head_checkpoints
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1, layers=4)
    source = tiny_models.save(model, tokenizer, tmp_path / "src")
    head = head_checkpoints.write_head("speculators_eagle3", tmp_path / "head", model)
    out = tmp_path / "a"
    options = ExportOptions(max_length=64, batched=True)
    manifest = export_pair(str(source), [str(head)], out, options, log=lambda _m: None)
    assert manifest.target.feature_size > 0
    _assert_same_bits(out, manifest.target)
    assert manifest.batched is not None
    _assert_same_bits(out, manifest.batched)


def test_a_frontier_tensor_changed_between_parts_changes_the_logits(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the later parts compute from what the earlier ones recorded."""
    import tiny_models
    from specx.exporter.checks import parts as check_parts
    from specx.exporter.checks.parity import run_passes

    model = tiny_models.build_model("qwen2", tokenizer.get_vocab_size(), seed=1, layers=3)
    source = tiny_models.save(model, tokenizer, tmp_path / "src")
    spec = export_target_alone(source, tmp_path / "a").target
    passes = _passes(spec.vocab_size)
    whole, _ = run_passes(tmp_path / "a", spec, passes, WHOLE)
    real = check_parts._run_part

    def nudged(session: Any, part: Any, *args: Any) -> None:
        real(session, part, *args)
        frontier = args[3]
        for name in part.outputs:
            value = frontier.get(name)
            if value is not None and value.dtype == np.float32:
                frontier[name] = value * np.float32(1.001)

    monkeypatch.setattr(check_parts, "_run_part", nudged)
    parted, _ = run_passes(tmp_path / "a", spec, passes, EACH_LEVEL)
    assert not np.array_equal(whole[0].logits, parted[0].logits)


def test_an_export_checked_in_parts_records_the_same_figures(tmp_path: Path) -> None:
    """Parity and the int4 calibration figures, whole and in parts; part files removed."""
    pytest.importorskip("gguf")
    from gguf_models import write_gguf

    source = write_gguf(tmp_path / "m.gguf", "qwen2", seed=0)
    figures = []
    for name, part_bytes in (("whole", WHOLE), ("parts", EACH_LEVEL)):
        manifest = export_target_alone(
            source, tmp_path / name, precision="int4", check_part_bytes=part_bytes
        )
        figures.append(dict(manifest.target.parity))
        assert not list((tmp_path / name).glob(".check-part*"))
    whole, parted = figures
    assert whole.pop("check_parts") == 1
    assert parted.pop("check_parts") == 3
    assert "calibration" in whole
    assert whole == parted


def test_a_part_size_below_the_minimum_is_refused_with_exit_2(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from specx.apps.cli.main import main

    out = tmp_path / "a"
    result = CliRunner().invoke(
        main, ["export", "--target", "x", "-o", str(out), "--check-part-size", "8"]
    )
    assert result.exit_code == 2
    assert "--check-part-size" in result.output
    assert not out.exists()

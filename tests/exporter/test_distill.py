"""`specx distill`: a feature draft trained on the target's own answers, end to end on a tiny
target: data, training with training-time test, the held-out report, the speculators EAGLE-3
checkpoint, export, exact greedy decoding with it, and --resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import Pipeline
from specx.runtime.settings import GenerationSettings

pytestmark = needs_exporter


def _tiny_source(tokenizer: Any, folder: Path) -> tuple[Any, Any]:
    """A tiny random Llama target, saved and loaded as `specx distill` loads one."""
    import tiny_models
    from specx.exporter.weights.load import load_source

    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1, layers=4)
    return model, load_source(str(tiny_models.save(model, tokenizer, folder / "target")), print)


def test_distill_writes_a_speculators_eagle3_head_and_a_held_out_report(
    distilled: dict[str, Any],
) -> None:
    head: Path = distilled["head"]
    config = json.loads((head / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == 160
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]
    from safetensors.torch import load_file

    tensors = load_file(str(head / "model.safetensors"))
    assert tensors["lm_head.weight"].shape == (160, 64)
    assert tensors["t2d"].sum() == 160 and tensors["d2t"].shape == (160,)
    report = json.loads((head / "distill_report.json").read_text())
    assert report["sequences"]["train"] > report["sequences"]["held_out"] > 0
    assert report["tokens"]["train"] > 1000
    assert len(report["held_out_acceptance"]) == 3
    assert all(0.0 <= a <= 1.0 for a in report["held_out_acceptance"])
    by_kind = report["held_out_by_kind"]
    assert "templated" in by_kind and set(by_kind) <= {
        "templated",
        "code",
        "self-written",
        "grounded",
    }
    assert all(len(v) == 3 for v in by_kind.values())
    from specx.exporter.heads.distill.data import load_sequences
    from specx.exporter.heads.distill.run import DATA_FILE

    kinds = {s.kind for s in load_sequences(head / DATA_FILE)}  # kept with the data
    assert "templated" in kinds and kinds <= {"templated", "code", "self-written", "grounded"}
    assert report["held_out_tokens_per_pass"]["1"] >= 1.0
    assert report["epochs"] == 150 and report["seconds"]["training"] < 10 * 60
    # the learning rate's cosine ends with the bound reached first (here the epochs, long
    # before the time budget): at its floor, a tenth of the peak
    import torch

    from specx.exporter.heads.distill.trainer import CHECKPOINT_FILE

    saved = torch.load(head / CHECKPOINT_FILE, weights_only=False)
    last_lr = saved["optimizer"]["param_groups"][0]["lr"]
    assert last_lr == pytest.approx(0.1 * distilled["options"].lr, rel=0.01)
    assert report["train_loss"] > 0
    assert any("held-out acceptance" in line for line in distilled["logs"])
    assert any("requests of its own" in line for line in distilled["logs"])


def test_a_distilled_head_drafts_what_the_target_says_on_its_training_prompts(
    distilled: dict[str, Any],
) -> None:
    """The tiny random target's answers are too arbitrary to generalise from 40 prompts, but a
    head that learned them must draft them: this checks that training sees the pairs the drafter
    reads at run time (a shifted pair would leave acceptance near zero)."""
    from specx.exporter.heads.distill.data import load_sequences
    from specx.exporter.heads.distill.run import DATA_FILE

    head: Path = distilled["head"]
    n_train = json.loads((head / "data.json").read_text())["train"]
    train = load_sequences(head / DATA_FILE)[:n_train]
    pipe = Pipeline.load(distilled["artifact"])
    model = distilled["model"]
    eos = pipe.manifest.special_tokens.eos_token_ids
    accepted = proposed = 0
    for seq in train[:8]:
        prompt = seq.ids[: seq.first_label]
        n = len(seq.ids) - seq.first_label
        got = pipe.generate(prompt, GenerationSettings(max_new_tokens=n, drafter="eagle", k=3))
        assert_same_or_near_tie(model, prompt, got.token_ids, hf_greedy(model, prompt, n, eos))
        accepted += got.stats.accepted
        proposed += got.stats.proposed
    assert proposed > 0 and accepted / proposed > 0.3, (accepted, proposed)


def test_distill_resumes_from_its_checkpoint_without_generating_again(
    distilled: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    from specx.exporter.heads.distill.run import DATA_FILE, distill
    from specx.exporter.heads.distill.trainer import CHECKPOINT_FILE

    head = tmp_path / "head"
    shutil.copytree(distilled["head"], head)
    data_mtime = os.path.getmtime(head / DATA_FILE)
    before = json.loads((head / "distill_report.json").read_text())
    import dataclasses

    import torch

    epochs_before = torch.load(head / CHECKPOINT_FILE, weights_only=False)["state"]["epoch"]
    options = dataclasses.replace(distilled["options"], resume=True, max_epochs=160)
    logs: list[str] = []
    report = distill(str(distilled["source"]), head, options, log=logs.append)
    assert any("reading the data of the last run" in line for line in logs)
    assert any("resuming at epoch" in line for line in logs)
    assert os.path.getmtime(head / DATA_FILE) == data_mtime
    assert report.sequences == before["sequences"]
    assert report.seconds["training"] > before["seconds"]["training"]
    assert torch.load(head / CHECKPOINT_FILE, weights_only=False)["state"]["epoch"] > epochs_before


def test_distill_reads_the_users_prompt_and_text_files(tmp_path: Path, tokenizer: Any) -> None:
    import tiny_models
    from specx.exporter.heads.distill.run import DistillOptions, distill

    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1, layers=4)
    source = tiny_models.save(model, tokenizer, tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"prompt": f"Tell me about number {i}."}) for i in range(12))
    )
    text = tmp_path / "notes.txt"
    text.write_text(" ".join(tiny_models.CORPUS) * 8)
    options = DistillOptions(
        prompts=(prompts,), texts=(text,), max_new_tokens=16, train_minutes=0.05, draft_vocab=0
    )
    report = distill(str(source), tmp_path / "head", options, log=lambda _m: None)
    assert report.sequences["train"] >= 10  # every one of the user's prompts (no sampling)
    assert report.held_out_by_kind and set(report.held_out_by_kind) <= {"user", "text"}
    assert report.draft_vocab == tokenizer.get_vocab_size()  # 0: the whole vocabulary
    assert report.taps == [2, 2, 1]


def test_the_runtime_records_in_its_passes_what_transformers_generates_and_computes(
    tmp_path: Path, tokenizer: Any, monkeypatch: Any
) -> None:
    """The CPU route (an exported graph decoding with continuous batching, recording as it goes)
    gives the same answers, taps and soft labels as transformers' generate plus a recording pass,
    for prompts of different lengths sharing passes, rows joining as others finish."""
    from specx.exporter.heads.distill import generate as distill_generate
    from specx.exporter.heads.distill.data import (
        Prompt,
        generate_answers,
        record_target,
        shipped_prompts,
    )
    from specx.exporter.heads.distill.generate import RuntimeGenerator, runtime_generation_possible
    from specx.exporter.heads.distill.run import _progress, default_taps
    from specx.exporter.weights.load import eos_token_ids
    from specx.runtime.errors import ExportError

    model, src = _tiny_source(tokenizer, tmp_path)
    assert runtime_generation_possible(src, "cpu") is None
    assert runtime_generation_possible(src, "cuda") is not None
    chat, code = shipped_prompts()
    prompts = chat[:4] + code[:2] + [Prompt("a much longer prompt " * 6, True)]
    taps, eos, bar = default_taps(4), eos_token_ids(src), _progress(lambda _m: None)
    logs: list[str] = []
    generator = RuntimeGenerator(src, taps, 3, logs.append)  # 7 prompts through 3 rows
    try:
        got = generator(prompts, 12, eos, bar)
        with pytest.raises(ExportError, match="no room for a prompt"):
            generator(prompts, distill_generate.MAX_LENGTH, eos, bar)
        # a prompt longer than the graph's positions leave: its last tokens are read
        monkeypatch.setattr(distill_generate, "MAX_LENGTH", 40)
        (tail,) = generator(prompts[-1:], 12, eos, bar)
        assert tail.first_label == 40 - 12 - 1 < len(got[-1].ids[: got[-1].first_label])
        assert np.array_equal(
            tail.ids[: tail.first_label], got[-1].ids[: got[-1].first_label][-27:]
        )
        assert any("prompts longer than 27 tokens" in m for m in logs)
    finally:
        generator.close()
    assert any("specx's runtime" in m for m in logs)
    want = generate_answers(src, prompts, 12, 8, eos, lambda _m: None, bar)
    record_target(src, want, taps, 8, bar)
    for g, w in zip(got, want, strict=True):
        assert g.first_label == w.first_label and np.array_equal(g.ids, w.ids)
        assert g.features is not None and w.features is not None
        assert g.features.shape == w.features.shape == (len(w.ids), 3 * model.config.hidden_size)
        assert np.allclose(g.features, w.features, rtol=1e-2, atol=1e-2)
        assert np.array_equal(g.top_ids[:, 0], w.top_ids[:, 0])  # type: ignore[index]
        assert np.allclose(g.top_probs, w.top_probs, atol=2e-3)  # type: ignore[arg-type]


def test_the_target_writes_requests_of_its_own_from_its_chat_templates_user_turn(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Self-written prompts: the chat template's opening of a user turn, continued by sampling
    at temperature 1 from the target itself (each continuation from its own seed, so not from
    the rows it shared passes with); whole turns kept, each once."""
    from specx.exporter.heads.distill.generate import RuntimeGenerator, sample_token
    from specx.exporter.heads.distill.run import _progress, default_taps
    from specx.exporter.heads.distill.self_prompts import (
        _sample_transformers,
        keep_requests,
        self_written_prompts,
        user_turn_prefix,
    )
    from specx.exporter.weights.load import eos_token_ids

    _, src = _tiny_source(tokenizer, tmp_path)
    prefix = user_turn_prefix(src)
    assert prefix == src.tokenizer("<s>user\n", add_special_tokens=False)["input_ids"]
    eos = eos_token_ids(src)
    logs: list[str] = []
    generator = RuntimeGenerator(src, default_taps(4), 3, logs.append)
    try:
        together = generator.sample(prefix, 5, 10, eos, seed=7)
        generator.rows = 1
        alone = generator.sample(prefix, 5, 10, eos, seed=7)
        other_seed = generator.sample(prefix, 5, 10, eos, seed=8)
        generator.rows = 4
        prompts = self_written_prompts(
            src, 3, eos, generator, 8, 0, logs.append, _progress(lambda _m: None)
        )
    finally:
        generator.close()
    assert together == alone != other_seed
    assert all(0 < len(c) <= 10 and (len(c) == 10 or c[-1] in eos) for c in together)
    assert len({tuple(c) for c in together}) == 5  # sampled, not greedy
    assert len(prompts) <= 3 and all(p.chat for p in prompts)
    assert any("requests of its own" in m for m in logs)
    by_transformers = _sample_transformers(src, prefix, 4, eos, 3, seed=0)
    assert len(by_transformers) == 4
    assert all(0 < len(c) <= 64 and (len(c) == 64 or c[-1] in eos) for c in by_transformers)
    # the draws follow softmax(logits)
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    counts = np.bincount([sample_token(logits, rng) for _ in range(4000)], minlength=4)
    assert np.allclose(counts / 4000, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    assert keep_requests(["Tell me a joke", " tell  me a JOKE ", "Hi", "Plan a trip now"], 5) == [
        "Tell me a joke",
        "Plan a trip now",
    ]
    assert keep_requests(["one two three", "four five six"], 1) == ["one two three"]


def test_the_shipped_prompts_share_nothing_with_the_bench_workloads() -> None:
    """The bench's prompts measure what a head learned elsewhere: none of them, nor any of
    their passages, may be in the distillation set."""
    from specx.apps.bench import load_workloads
    from specx.exporter.heads.distill.data import GROUNDED_TEMPLATES, shipped_prompts

    chat, code = shipped_prompts()
    shipped = {p.text for p in chat + code}
    assert len(shipped) == len(chat) + len(code) > 800
    for workload in load_workloads().values():
        for prompt in workload["prompts"]:
            assert prompt not in shipped
            assert not any(prompt.startswith(t.split("{p}")[0]) for t in GROUNDED_TEMPLATES)
            head = prompt.split("\n")[0]
            assert not any(s.startswith(head) for s in shipped), head


def test_distill_refuses_bad_options_with_exit_2_and_leaves_nothing(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from specx.apps.cli.main import main

    runner = CliRunner()
    out = tmp_path / "head"
    for args, message in (
        (["--steps", "0"], "--steps must be in 1..8"),
        (["--train-minutes", "0"], "--train-minutes must be positive"),
        (["--prompts", str(tmp_path / "missing.txt")], "does not exist"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--generate-rows", "0"], "--generate-rows must be at least 1"),
        (["--self-prompts", "-1"], "--self-prompts must be at least 0"),
        (["--max-prompts", "-1"], "--max-prompts must be at least 0"),
    ):
        result = runner.invoke(main, ["distill", "some/model", "-o", str(out), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert not out.exists()
    out.mkdir()
    (out / "something").write_text("x")
    result = runner.invoke(main, ["distill", "some/model", "-o", str(out)])
    assert result.exit_code == 2 and "--resume" in result.output
    assert np.array_equal(sorted(p.name for p in out.iterdir()), ["something"])

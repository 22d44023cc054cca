"""The batch diagnostics of scripts/diagnostics/ on the tiny batched llama: step_parts (where a
batch step's time goes, its timing wrappers removed afterwards), batch_rows, batch_of_one and
batch_trace."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort
import pytest

from batch_tools import PROMPTS, prompt_ids
from conftest import load_script, needs_exporter
from specx.runtime import Pipeline

pytestmark = needs_exporter


def test_the_step_parts_script_splits_batch_steps_and_puts_back_what_it_timed(
    batched_llama: Any,
) -> None:
    from specx.runtime.batch.decoder import BatchDecoder
    from specx.runtime.batch.widths import WidthPlanner

    script = load_script("step_parts")
    before = (
        BatchDecoder.step,
        WidthPlanner.plan,
        "run_with_iobinding" in vars(ort.InferenceSession),
    )
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    prompts = [prompt_ids(pipe, p) for p in PROMPTS[:3]]
    parts = script.step_parts(pipe, prompts, 2, 1, "ngram+mixed", new_tokens=6)
    after = (
        BatchDecoder.step,
        WidthPlanner.plan,
        "run_with_iobinding" in vars(ort.InferenceSession),
    )
    assert after == before  # the timing wrappers are gone
    for mode in ("off", "-k auto"):
        p = parts[mode]
        assert p["steps"] >= 6 and p["tok/s"] > 0
        assert 0 < p["onnxruntime"] < p["step"] and p["rest"] > 0
        assert p["planner"] >= 0 and p["onnxruntime"] + p["planner"] + p["rest"] == pytest.approx(
            p["step"]
        )
    ms = script.prefill_logits(pipe, 20, 2)
    assert set(ms) == {"prefill", "lm_head", "every output fetched", "logits not fetched"}
    assert all(v > 0 for v in ms.values())


def test_the_batch_rows_script_counts_each_rows_passes_and_drafts(batched_llama: Any) -> None:
    script = load_script("batch_rows")
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    prompts = [prompt_ids(pipe, p) for p in PROMPTS[:3]]
    off = script.batch_rows(pipe, prompts, 2, 0, new_tokens=6, drafter="mixed")
    drafted = script.batch_rows(pipe, prompts, 2, 3, new_tokens=6, drafter="mixed")
    assert len(off) == len(drafted) == 2  # ceil(3 / 2) batches of 2 rows
    for b in off:
        assert [row[:1] for row in b] == [(6,), (6,)]
        assert all(passes == 6 and proposed == accepted == 0 for _, passes, proposed, accepted in b)
    rows = [row for b in drafted for row in b]
    assert all(proposed > 0 and 0 <= accepted <= proposed for _, _, proposed, accepted in rows)
    # each pass commits one token and what it accepted (the last may cut some off)
    assert all(passes <= tokens <= passes + accepted for tokens, passes, _, accepted in rows)


def test_the_batch_of_one_script_compares_it_with_the_same_request_alone(
    batched_llama: Any,
) -> None:
    script = load_script("batch_of_one")
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    prompts = [prompt_ids(pipe, p) for p in PROMPTS[:2]]
    totals = script.alone_and_batch_of_one(
        pipe, prompts, 2, new_tokens=8, drafter="mixed", modes=("off", "2", "auto"), between=2
    )
    assert set(totals) == {"off", "2", "auto"}
    for mode, ways in totals.items():
        assert set(ways) == {"alone", "batch of one"}
        for t in ways.values():  # the second round only: 2 prompts x 8 tokens
            assert t["tokens"] == 16 and 0 < t["passes"] <= 16 and t["seconds"] > 0
            if mode != "auto":  # -k auto may judge drafting too costly on a loaded machine
                assert (t["passes"] == 16) == (mode == "off")  # off: one token a pass


def test_the_batch_trace_script_traces_the_concurrency_benchs_own_run(batched_llama: Any) -> None:
    script = load_script("batch_trace")
    artifact, _ = batched_llama
    lines = script.bench_steps(Pipeline.load(artifact), 1, "mixed", prompts=2, new_tokens=6)
    text = "\n".join(lines)
    assert "mode" in lines[0] and "mixed K=auto" in text  # the bench's table
    planned = [line for line in lines if " rows plain " in line or " rows drafted " in line]
    assert planned and all(int(line.split("steps")[1].split()[0]) > 0 for line in planned)
    assert any("shared draft-model runs" in line for line in lines)  # the fixed-K rows' runs

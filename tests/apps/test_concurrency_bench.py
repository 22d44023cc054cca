"""The concurrency bench (apps/bench/concurrency.py): every prompt at every concurrency, the
modes interleaved, and its figures (tokens a second over a cell's whole workload, ratios paired
within each repeat)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from batch_tools import PROMPTS, prompt_ids
from conftest import needs_exporter
from specx.runtime import Pipeline

pytestmark = needs_exporter


def test_the_concurrency_bench_runs_every_prompt_at_every_concurrency(
    batched_llama: Any, monkeypatch: Any
) -> None:
    import specx.apps.bench.concurrency as bench

    assert bench.together_batches(5, 2, 1) == [[1, 2], [3, 4], [0, 1]]
    assert bench.together_batches(5, 8, 0) == [[0, 1, 2, 3, 4, 0, 1, 2]]
    three = [{"name": n} for n in "abc"]
    order = ["".join(m["name"] for m in bench.mode_order(three, r)) for r in range(4)]
    assert order == ["abc", "bca", "cab", "abc"]  # each mode first once in as many units
    units = bench.work_units(2, (1, 2), 0)
    assert units == [("alone", [[0]]), ("alone", [[1]]), (1, [[0], [1]]), (2, [[0, 1]])]
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    prompts = [prompt_ids(pipe, p) for p in PROMPTS[:3]]
    ran: dict[int, list[int]] = {}
    calls: list[tuple[int, Any]] = []  # (requests, K) of each batch, in the order they ran
    together = bench._together

    def counted(pipe: Any, batch: list[np.ndarray], settings: Any) -> Any:
        ids = [next(i for i, p in enumerate(prompts) if p is q) for q in batch]
        ran.setdefault(len(batch), []).extend(ids)
        calls.append((len(batch), settings.k))
        return together(pipe, batch, settings)

    monkeypatch.setattr(bench, "_together", counted)
    modes = bench.concurrency_modes("mixed", (2,), auto=True)
    results = bench.run_concurrency(pipe, prompts, (1, 2), modes, 4, 1, lambda _m: None)
    for c in (1, 2):  # each of the 3 modes ran every prompt, in ceil(3 / c) batches of c
        assert sorted(set(ran[c])) == [0, 1, 2] and len(ran[c]) == 3 * -(-3 // c) * c
    # interleaved: every mode ran its 1-request batches before any mode its 2-request ones,
    # each mode's batches of a concurrency back to back, the modes' order turned per unit
    assert [n for n, _ in calls] == [1] * 9 + [2] * 6
    assert [k for _, k in calls[:9:3]] == [0, 2, "auto"]  # unit 3 of repeat 0: turned by 3
    assert [k for _, k in calls[9::2]] == [2, "auto", 0]  # unit 4: turned by 4 = 1 mod 3
    rows = results["rows"]
    assert [(r["mode"], r["concurrency"]) for r in rows[:3]] == [
        ("off", "alone"),
        ("off", 1),
        ("off", 2),
    ]
    assert all(r["tokens_per_s"] > 0 and r["latency_s"] > 0 for r in rows)
    assert all(r["x_alone"] == 1.0 for r in rows if r["concurrency"] == "alone")
    assert "mixed K=auto" in bench.format_concurrency(results)
    assert all(r["x_alone_paired"] == 1.0 for r in rows if r["concurrency"] == "alone")
    assert [("x_better_paired" in r) for r in rows] == [r["mode"] == "mixed K=auto" for r in rows]
    # every run is kept, as the JSON the bench writes (a recount of any figure needs them)
    runs = json.loads(json.dumps(results))["runs"]
    assert len(runs["off|2"]) == 2 and {r["repeat"] for r in runs["off|alone"]} == {0}


def test_paired_concurrency_ratios_are_taken_within_each_repeat() -> None:
    """The VM runs twice as fast in the second repeat as in the first; in both, -k auto ran
    0.9x speculation off at 4 requests: the paired ratio says 0.9, against the fastest other
    mode of each repeat, and only -k auto's rows get one."""
    from specx.apps.bench.concurrency import _summarize

    def cell(per_repeat: list[float], together: bool = True) -> dict:
        runs = [
            {"tokens": 64 * t, "wall_s": 1.0, "ttft_s": 0.1, "repeat": r}
            | (
                {"latency_s": [1.0], "ttft_s": [0.1], "accepted_per_pass": [1.0]}
                if together
                else {}
            )
            for r, t in enumerate(per_repeat)
        ]
        return {"runs": runs}

    modes = [{"name": "off", "k": 0}, {"name": "x K=2", "k": 2}, {"name": "x K=auto", "k": "auto"}]
    raw = {
        "off|alone": cell([1.0, 2.0], together=False),
        "off|4": cell([3.0, 6.0]),
        "x K=2|alone": cell([1.1, 2.2], together=False),
        "x K=2|4": cell([2.0, 4.0]),
        "x K=auto|alone": cell([1.1, 2.2], together=False),
        "x K=auto|4": cell([2.7, 5.4]),  # 0.9 of off at 4 in both repeats
    }
    rows = {(r["mode"], r["concurrency"]): r for r in _summarize(raw, modes, (4,))}
    auto = rows[("x K=auto", 4)]
    assert np.isclose(auto["x_better_paired"], 0.9)
    assert np.isclose(rows[("x K=auto", "alone")]["x_better_paired"], 1.0)  # ties K=2
    assert np.isclose(auto["x_alone_paired"], 2.7 / 1.1)
    assert "x_better_paired" not in rows[("off", 4)]


def test_a_concurrency_cells_tokens_per_second_is_its_whole_workloads_not_its_median_batchs() -> (
    None
):
    """Three batches a repeat, of different prompts: speculation off makes 64, 128 and 128
    tokens in a second each, -k auto 96, 96 and 128. Over the workload both made 320 tokens in
    3 s; the median batch (128 against 96) would say -k auto ran 0.75x speculation off."""
    from specx.apps.bench.concurrency import _summarize

    def cell(tokens: list[int], together: bool = True) -> dict:
        extra = {"latency_s": [1.0], "ttft_s": [0.1], "accepted_per_pass": [1.0]}
        runs = [
            {"tokens": t, "wall_s": 1.0, "ttft_s": 0.1, "repeat": r} | (extra if together else {})
            for r in range(3)
            for t in tokens
        ]
        return {"runs": runs}

    modes = [{"name": "off", "k": 0}, {"name": "x K=auto", "k": "auto"}]
    raw = {
        "off|alone": cell([64], together=False),
        "off|4": cell([64, 128, 128]),
        "x K=auto|alone": cell([64], together=False),
        "x K=auto|4": cell([96, 96, 128]),
    }
    rows = {(r["mode"], r["concurrency"]): r for r in _summarize(raw, modes, (4,))}
    off, auto = rows[("off", 4)], rows[("x K=auto", 4)]
    assert np.isclose(off["tokens_per_s"], 320 / 3) and np.isclose(auto["tokens_per_s"], 320 / 3)
    assert np.isclose(auto["x_alone"], 320 / 3 / 64)
    assert (off["tokens_per_s_median_run"], auto["tokens_per_s_median_run"]) == (128.0, 96.0)

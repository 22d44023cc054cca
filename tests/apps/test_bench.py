"""`specx bench` end to end on a tiny artifact: every figure present, report and plot written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import TinyPair, load_script, needs_exporter
from specx.apps.bench.report import adaptive_vs_fixed
from specx.apps.cli.main import main

pytestmark = needs_exporter


def test_bench_measures_every_configuration_and_writes_table_json_and_plot(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            str(llama_pair.artifact),
            "--workloads",
            "chat,code",
            "--drafters",
            "mixed,ngram",
            "--k",
            "1,3",
            "--prompts",
            "1",
            "--repeats",
            "2",
            "-n",
            "16",
            "--temperatures",
            "0.7",
            "--peers",
            "",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert {"machine", "costs", "greedy", "sampling", "peers"} <= set(data)
    assert data["costs"]["bandwidth_bytes_per_s"] > 1e8
    assert data["costs"]["read_bandwidth_bytes_per_s"] > 1e8
    per_token = data["costs"]["bytes_per_token"]
    assert 0 < per_token["target"] <= data["costs"]["target_weight_bytes"]
    assert set(per_token) == {"target", "mixed"}
    assert set(data["costs"]["decode_step_by_context_s"]) == {"64", "126"}  # capped at the cache
    for workload in ("chat", "code"):
        rows = data["greedy"][workload]
        assert set(rows) == {
            "target",
            "mixed K=1",
            "mixed K=3",
            "mixed K=auto",
            "ngram K=1",
            "ngram K=3",
            "ngram K=auto",
        }
        assert rows["target"]["speedup"] == 1.0
        mixed = rows["mixed K=3"]
        assert 0.0 < mixed["acceptance_rate"] < 1.0 and len(mixed["acceptance_per_position"]) == 3
        assert mixed["c"] > 0 and mixed["verify_ratio"] > 0 and mixed["predicted_speedup"] > 0
        shares = mixed["draft_share"] + mixed["verify_share"] + mixed["overhead_share"]
        assert abs(shares - 1.0) < 0.02
    assert {"0.0", "0.7", "0.7 rejection"} == set(data["sampling"])
    report = (out / "report.txt").read_text()
    assert "== chat" in report and "meas/pred" in report and "decode floor" in report
    assert "K=auto / best fixed K, decode tok/s" in report and "): mixed " in report
    assert (out / "speedup.png").stat().st_size > 10_000
    rerendered = CliRunner().invoke(main, ["bench", "x", "--from-json", str(out / "results.json")])
    assert rerendered.exit_code == 0 and "== code" in rerendered.output


def test_the_report_compares_k_auto_with_each_drafters_best_fixed_k() -> None:
    rows = {
        name: {"decode_tokens_per_s": tps}
        for name, tps in {
            "target": 50.0,
            "int8 K=1": 55.0,
            "int8 K=2": 60.0,
            "int8 K=auto": 57.0,
            "ngram+int8 K=2": 70.0,
            "ngram+int8 K=auto": 77.0,
        }.items()
    }
    ratios = adaptive_vs_fixed(rows)
    assert ratios["int8"] == (pytest.approx(0.95), "2")
    assert ratios["ngram+int8"] == (pytest.approx(1.1), "2")
    assert set(ratios) == {"int8", "ngram+int8"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "1,x"], "--k takes comma-separated int values"),
        (["--k", "0,2"], r"--k takes values in 1\.\.16"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--temperatures", "0,nan"], "--temperatures must be finite and > 0"),
        (["--threads", "0"], r"threads must be in 1\.\.1024"),
    ],
)
def test_bad_bench_options_are_clean_errors(
    llama_pair: TinyPair, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(main, ["bench", str(llama_pair.artifact), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert re.search(message, result.stderr), result.stderr


def test_the_goal_script_reads_issue_16s_figures_from_a_concurrency_run() -> None:
    script = load_script("concurrency_goals")

    def run(auto_at_4: float, fixed_alone: float) -> dict:
        speeds = {
            "off": {"alone": 60.0, 1: 60.0, 2: 110.0, 4: 190.0, 8: 300.0},
            "ngram K=2": {"alone": fixed_alone, 1: 70.0, 2: 95.0, 4: 130.0, 8: 170.0},
            "ngram K=auto": {"alone": 72.0, 1: 70.0, 2: 108.0, 4: auto_at_4, 8: 290.0},
        }
        rows = [
            {"mode": m, "concurrency": c, "tokens_per_s": t, "latency_x_alone": 1.5}
            for m, by_c in speeds.items()
            for c, t in by_c.items()
        ]
        return {"rows": rows, "machine": {"date": "today"}}

    met = script.goals(run(auto_at_4=185.0, fixed_alone=70.0))
    assert np.isclose(met["aggregate_at_4"], 185.0 / 72.0)
    assert np.isclose(met["auto_share"]["4"], 185.0 / 190.0)
    assert met["met"] == (True, True, True)
    # the same bar for every mode: the fixed K alone against the faster of off and -k auto
    assert np.isclose(met["every_mode_share"]["ngram K=2"]["alone"], 70.0 / 72.0)
    assert met["every_mode_share"]["ngram K=auto"] == met["auto_share"]
    # slower at 4 than 2.5x alone, and alone below 0.95 of the fixed K: two goals missed
    missed = script.goals(run(auto_at_4=175.0, fixed_alone=80.0))
    assert missed["met"] == (False, True, False)


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


def test_an_unknown_peer_is_refused_with_exit_2(llama_pair: TinyPair) -> None:
    result = CliRunner().invoke(main, ["bench", str(llama_pair.artifact), "--peers", "vllm"])
    assert result.exit_code == 2
    assert "unknown peer 'vllm'" in result.output and "llama.cpp" in result.output


def test_the_llama_cpp_peer_says_why_it_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specx.apps.bench import llamacpp_peer as peer
    from specx.apps.bench.llamacpp_peer import llamacpp_peer

    monkeypatch.setattr(peer, "DEFAULT_SERVER", tmp_path / "absent")
    monkeypatch.delenv("SPECX_LLAMA_SERVER", raising=False)
    prompts = [np.array([1, 2, 3])]
    missing = llamacpp_peer(str(tmp_path / "none"), "x.gguf", None, prompts, 8, 1, 2, print)
    assert "setup_llamacpp.sh" in missing["skipped"]
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    folder = tmp_path / "model"
    not_gguf = llamacpp_peer(str(fake), str(folder), None, prompts, 8, 1, 2, print)
    assert "no GGUF file" in not_gguf["skipped"]
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    failed = llamacpp_peer(str(fake), str(gguf), None, prompts, 8, 1, 2, print)
    assert "exited" in failed["target"]["error"]

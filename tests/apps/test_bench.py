"""`specx bench` end to end on a tiny artifact: every figure present, report and plot written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import TinyPair, needs_exporter
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


def _genai_pair(root: Path, name: str, target_gguf: Path) -> Path:
    pair = root / name
    for folder in ("target-int4", "draft-int4"):
        (pair / folder).mkdir(parents=True)
        (pair / folder / "genai_config.json").write_text("{}")
    (pair / "source.json").write_text(json.dumps({"target": str(target_gguf.resolve())}))
    return pair


def test_the_genai_peer_runs_the_pair_built_from_the_artifacts_own_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specx.apps.bench import genai_peer as peer
    from specx.apps.bench.runner import BenchConfig

    target = tmp_path / "qwen.gguf"
    target.write_bytes(b"GGUF")
    other = tmp_path / "smol.gguf"
    other.write_bytes(b"GGUF")
    root = tmp_path / "genai"
    _genai_pair(root, "a-smollm2", other)
    pair = _genai_pair(root, "qwen-coder", target)
    monkeypatch.setattr(peer, "DEFAULT_MODELS", root)
    assert peer.pair_for(str(target), root) == pair
    assert peer.pair_for(str(tmp_path / "absent.gguf"), root) is None

    # A stand-in for the GenAI python: faster with a draft, slower at larger K.
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--k\\ 2*) r=30;; *--k\\ 4*) r=25;; *) r=20;; esac\n'
        'echo "{\\"median_tokens_per_s\\": $r, \\"speculative\\": true, \\"version\\": \\"0\\"}"\n'
    )
    fake.chmod(0o755)
    cfg = BenchConfig(artifact=tmp_path, ks=(2, 4), genai_python=str(fake))
    monkeypatch.delenv("SPECX_GENAI_MODELS", raising=False)
    out = peer.genai_peer(cfg, str(target), [np.array([1, 2, 3])], lambda _: None)
    assert out["models"] == str(pair) and out["target_folder"] == "target-int4"
    rates = {name: r["tokens_per_s"] for name, r in out.items() if isinstance(r, dict)}
    assert rates == {"target": 20, "int4 K=2": 30, "int4 K=4": 25}

    from specx.apps.bench.report import _peer_fastest

    assert _peer_fastest(out) == ("int4 K=2", 30.0)


def test_the_genai_peer_says_why_it_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specx.apps.bench import genai_peer as peer
    from specx.apps.bench.runner import BenchConfig

    monkeypatch.setattr(peer, "DEFAULT_MODELS", tmp_path / "genai")
    monkeypatch.delenv("SPECX_GENAI_MODELS", raising=False)
    monkeypatch.delenv("SPECX_GENAI_PYTHON", raising=False)
    prompts = [np.array([1, 2, 3])]
    no_python = BenchConfig(artifact=tmp_path, genai_python=str(tmp_path / "none"))
    assert "setup_genai.sh" in peer.genai_peer(no_python, "t.gguf", prompts, print)["skipped"]
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    no_pair = BenchConfig(artifact=tmp_path, genai_python=str(python))
    skipped = peer.genai_peer(no_pair, str(tmp_path / "t.gguf"), prompts, print)["skipped"]
    assert "no GenAI pair built from" in skipped and "setup_genai.sh MODEL" in skipped
    two = tmp_path / "two"
    for folder in ("target-fp32", "target-int4"):
        (two / folder).mkdir(parents=True)
        (two / folder / "genai_config.json").write_text("{}")
    given = BenchConfig(artifact=tmp_path, genai_python=str(python), genai_models=str(two))
    assert "expected one built target-*" in peer.genai_peer(given, "t", prompts, print)["skipped"]


def test_single_turn_runs_are_cold_no_prefix_or_suffix_history_carries_between_repeats(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    # every configuration and repeat runs the same prompt: a kept prefix or the suffix
    # drafter's history of the earlier answers would make later runs look faster
    out = tmp_path / "bench"
    args = ["bench", str(llama_pair.artifact), "--workloads", "code", "--drafters", "suffix"]
    args += ["--k", "4", "--no-auto", "--prompts", "1", "--repeats", "3", "-n", "24"]
    args += ["--temperatures", "", "--peers", "", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    records = json.loads((out / "results.json").read_text())["greedy_records"]
    assert {r["config"] for r in records} == {"target", "suffix K=4"}
    assert all(r["cached_tokens"] == 0 for r in records)
    for config in ("target", "suffix K=4"):
        runs = [r for r in records if r["config"] == config]
        assert len(runs) == 3
        assert len({r["target_passes"] for r in runs}) == 1, runs
        assert len({r["token_digest"] for r in runs}) == 1

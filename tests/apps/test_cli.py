"""`specx run` / `specx export` from the outside: streams, summary, JSON, and clean errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import TinyPair, needs_exporter
from specx.apps.cli.main import main

pytestmark = needs_exporter


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPECX_THREAD_POOL"}  # the CLI default
    return subprocess.run(
        [sys.executable, "-m", "specx.apps.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_run_prints_text_on_stdout_and_a_one_line_summary_on_stderr(llama_pair: TinyPair) -> None:
    proc = run_cli(
        "run",
        str(llama_pair.artifact),
        "-p",
        "The cat is",
        "-k",
        "4",
        "--draft",
        "mixed",
        "-n",
        "30",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    summary = proc.stderr.strip().splitlines()[-1]
    for part in ("30 tokens", "tok/s", "target passes", "acceptance", "tokens/pass"):
        assert part in summary


def test_run_json_gives_text_token_ids_and_every_statistic(llama_pair: TinyPair) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(llama_pair.artifact),
            "-p",
            "The cat",
            "-n",
            "12",
            "--json",
            "--draft",
            "mixed",
            "-k",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["token_ids"]) == 12 and isinstance(data["text"], str)
    stats = data["stats"]
    for key in (
        "tokens_per_s",
        "target_passes",
        "acceptance_rate",
        "tokens_per_pass",
        "acceptance_per_position",
        "draft_s",
        "verify_s",
        "prefill_s",
    ):
        assert key in stats
    assert stats["k"] == 2 and stats["drafter"] == "mixed"


@pytest.mark.parametrize("flag", [["-k", "0"], ["--no-draft"]])
def test_k_zero_and_no_draft_run_the_target_alone(llama_pair: TinyPair, flag: list[str]) -> None:
    result = CliRunner().invoke(
        main, ["run", str(llama_pair.artifact), "-p", "The cat", "-n", "9", "--json", *flag]
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["target_passes"] == 9 and stats["proposed"] == 0 and stats["drafter"] == "none"


def test_chat_applies_the_models_chat_template(llama_pair: TinyPair) -> None:
    result = CliRunner().invoke(
        main, ["run", str(llama_pair.artifact), "-p", "Hi", "--chat", "-n", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    # <s>user\nHi</s>\n<s>assistant\n: far more tokens than "Hi" alone
    assert json.loads(result.stdout)["prompt_tokens"] > 5


def test_a_missing_artifact_folder_is_a_clean_error(tmp_path: Path) -> None:
    proc = run_cli("run", str(tmp_path / "nope"), "-p", "hi")
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "is not a folder" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_corrupt_graph_is_a_clean_error(llama_pair: TinyPair, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(llama_pair.artifact, broken)
    data = (broken / "target.onnx").read_bytes()
    (broken / "target.onnx").write_bytes(data[: len(data) // 2])  # truncated
    proc = run_cli("run", str(broken), "-p", "hi", "-k", "0")
    assert proc.returncode == 2
    assert "cannot load target.onnx" in proc.stderr and "re-export" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_prompt_longer_than_the_context_is_a_clean_error(llama_pair: TinyPair) -> None:
    proc = run_cli("run", str(llama_pair.artifact), "-p", "word " * 400, "-k", "0")
    assert proc.returncode == 2
    assert "maximum context is 128" in proc.stderr and "--max-length" in proc.stderr


def test_export_of_a_missing_model_is_a_clean_error(tmp_path: Path) -> None:
    proc = run_cli("export", "--target", str(tmp_path / "none"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_cli("run", str(tmp_path / "nope"), "-p", "hi", "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m specx.apps.cli.main profiles | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.startswith("name") and "error" not in proc.stderr


def test_info_json_gives_the_facts_a_deployment_tool_needs(llama_pair: TinyPair) -> None:
    result = CliRunner().invoke(main, ["info", str(llama_pair.artifact), "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["facts_version"] == 1 and facts["format_version"] == 4  # gqa: logits count
    assert facts["context"] == 128 and facts["default_drafter"] == "mixed"
    assert facts["drafters"][-1] == "none" and "ngram+mixed" in facts["drafters"]
    models = {m["name"]: m for m in facts["models"]}
    assert set(models) == {"target", "mixed", "other", "self"}
    target = models["target"]
    assert target["attention"] == "gqa" and target["variant"] == "fp32"
    assert "com.microsoft:GroupQueryAttention" in target["operators"]
    assert target["min_onnxruntime"] == "1.20" and target["operators_recorded"]
    assert models["self"]["kind"] == "self" and models["mixed"]["kind"] == "model"
    assert facts["onnxruntime"]["contrib_operators"] == ["com.microsoft:GroupQueryAttention"]
    per_token = facts["kv_cache_bytes"]["per_token"]
    assert per_token > 0 and facts["kv_cache_bytes"]["full_context"] == 128 * per_token
    text = CliRunner().invoke(main, ["info", str(llama_pair.artifact)])
    assert "needs    onnxruntime >= 1.20" in text.stdout


def test_the_repository_is_complete_and_refuses_to_overwrite(
    tmp_path: Path, llama_pair: TinyPair
) -> None:
    out = tmp_path / "repo"
    first = CliRunner().invoke(main, ["triton", str(llama_pair.artifact), "-o", str(out)])
    assert first.exit_code == 0, first.output
    config = (out / "specx" / "config.pbtxt").read_text()
    assert "decoupled: true" in config and 'name: "text_input"' in config
    assert str(llama_pair.artifact.resolve()) in config
    assert (out / "specx" / "1" / "model.py").is_file()
    again = CliRunner().invoke(main, ["triton", str(llama_pair.artifact), "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr

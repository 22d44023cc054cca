"""`specx run` with bad input, at the limits, and interrupted: exit codes and messages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from conftest import TinyPair, needs_exporter
from specx.apps.cli.main import main

pytestmark = needs_exporter


def test_cli_bad_values_exit_2_without_traceback(llama_pair: TinyPair, tmp_path: Path) -> None:
    bad_file = tmp_path / "prompt.txt"
    bad_file.write_bytes(b"caf\xe9 au lait")  # latin-1, not UTF-8
    lark = tmp_path / "g.lark"
    lark.write_text("start: missing_rule\n")
    cases = [
        (["-p", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["-p", "hi", "--top-p", "1.5"], "top-p must be in (0, 1]"),
        (["-p", "hi", "-k", "40"], "K must be in 0..16"),
        (["-p", ""], "the prompt is empty"),
        (["--prompt-file", str(bad_file)], "is not valid UTF-8 (byte 3"),
        (["-p", "hi", "--grammar", str(tmp_path / "g.txt")], "cannot tell the grammar format"),
        (["-p", "hi", "--grammar", str(lark)], "invalid lark grammar"),
        (["-p", "hi", "--json-schema", str(bad_file)], "cannot read the grammar file"),
        (["-p", "hi", "--json-schema", str(lark)], "not valid JSON"),
        (["-p", "hi", "--json-object", "--grammar", str(lark)], "pass one of them"),
        (["-p", "hi", "--logprobs", "2"], "--logprobs needs --json"),
        (["-p", "hi", "--logprobs", "30", "--json"], "top logprobs must be in 0..20"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["run", str(llama_pair.artifact), *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_structured_output_from_the_cli_parses_and_reports_logprobs(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    import json

    schema = tmp_path / "answer.json"
    schema.write_text(
        '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],'
        ' "additionalProperties": false}'
    )
    gbnf = tmp_path / "yes.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    art = str(llama_pair.artifact)
    result = CliRunner().invoke(
        main, ["run", art, "-p", "hi", "--json-schema", str(schema), "--json", "--logprobs", "2"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert json.loads(out["text"]).keys() == {"ok"}
    assert len(out["logprobs"]) == len(out["token_ids"])
    assert all(e["logprob"] <= 0 and len(e["top"]) <= 2 for e in out["logprobs"])
    result = CliRunner().invoke(main, ["run", art, "-p", "hi", "--grammar", str(gbnf), "-k", "2"])
    assert result.exit_code == 0 and result.stdout.strip() in ("yes", "no"), result.output
    result = CliRunner().invoke(main, ["run", art, "-p", "hi", "--json-object", "-n", "3"])
    assert result.exit_code == 0 and "may not parse" in result.stderr


def test_max_new_tokens_past_the_cache_stops_at_the_limit_and_says_so(
    llama_pair: TinyPair,
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(llama_pair.artifact),
            "-p",
            "The cat is sitting on the mat. " * 8,
            "-n",
            "500",
            "-k",
            "3",
            "--draft",
            "mixed",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "stopped at the maximum context (128 tokens)" in result.stderr
    assert "stop: max_length" in result.stderr


def test_ctrl_c_prints_what_was_generated_and_the_stats_then_exits_130(
    long_pair: TinyPair,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPECX_THREAD_POOL"}

    def default_sigint() -> None:
        # A process started in the background by a non-interactive shell inherits SIGINT
        # ignored, and Python then never raises KeyboardInterrupt: give the child the default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specx.apps.cli.main",
            "run",
            str(long_pair.artifact),
            "-p",
            "The cat",
            "-n",
            "2000",
            "-k",
            "0",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    first = proc.stdout.read1(64)  # type: ignore[attr-defined]  # streamed: text arrives early
    assert first
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    text = err.decode()
    assert "note: interrupted" in text and "stop: interrupted" in text
    assert "Traceback" not in text

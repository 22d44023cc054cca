"""`specx bench --sessions`: conversations turn by turn, each mode with its own answers; reuse
keeps the conversation, the answers stay the reference's, the report says both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from conftest import TinyPair, needs_exporter
from specx.apps.bench.sessions import REFERENCE, format_sessions, run_session_bench, session_rows
from specx.apps.cli.main import main

pytestmark = needs_exporter


def tiny_sessions(path: Path) -> Path:
    """Short turns: the tiny models hold 128 positions."""
    data = {
        "sessions": {
            "talk": {
                "max_new_tokens": 8,
                "system": "Be brief.",
                "turns": ["Cats?", "Dogs?", "Why?"],
            },
            "copy": {"max_new_tokens": 10, "system": "Echo.", "turns": ["abc abc abc", "abc"]},
        }
    }
    path.write_text(json.dumps(data))
    return path


def test_each_mode_answers_every_turn_and_reuse_keeps_the_conversation(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    messages: list[str] = []
    results = run_session_bench(
        llama_pair.artifact,
        ("talk", "copy"),
        ("ngram", "suffix", "mixed"),
        (),
        None,
        None,
        8,
        messages.append,
        tiny_sessions(tmp_path / "sessions.json"),
    )
    modes = results["modes"]
    assert list(modes) == [
        REFERENCE,
        "specx",
        "specx ngram K=auto",
        "specx suffix K=auto",
        "specx mixed K=auto",
    ]
    rows = session_rows(results)
    for sname, n_turns in (("talk", 3), ("copy", 2)):
        by_mode = {r["mode"]: r for r in rows[sname]}
        assert by_mode[REFERENCE]["cached"] == [0] * n_turns  # reuse off reads every prompt
        warm = by_mode["specx"]
        assert warm["cached"][0] == 0 and all(c > 0 for c in warm["cached"][1:])
        for row in rows[sname]:  # every mode gave the reference's answers (greedy is exact)
            assert row["same_turns"] == n_turns, row["mode"]
            assert row["turns"] == n_turns and all(t > 0 for t in row["first_token_s"])
    report = format_sessions(results)
    assert "talk: 3 turns" in report and "best specx:" in report


def test_the_cli_runs_sessions_and_writes_the_report(llama_pair: TinyPair, tmp_path: Path) -> None:
    from specx.apps.bench import sessions as module

    original = module.load_sessions
    sessions = tiny_sessions(tmp_path / "s.json")

    def tiny(path: Any = None) -> dict[str, Any]:
        return original(sessions)

    module.load_sessions = tiny  # type: ignore[assignment]
    try:
        out = tmp_path / "out"
        result = CliRunner().invoke(
            main,
            [
                "bench",
                str(llama_pair.artifact),
                "--sessions",
                "talk",
                "--drafters",
                "suffix",
                "--peers",
                "",
                "-o",
                str(out),
            ],
        )
    finally:
        module.load_sessions = original  # type: ignore[assignment]
    assert result.exit_code == 0, result.output
    assert (out / "sessions.json").is_file() and "specx suffix K=auto" in result.stdout
    bad = CliRunner().invoke(main, ["bench", str(llama_pair.artifact), "--sessions", "nope"])
    assert bad.exit_code == 2 and "unknown session" in bad.stderr

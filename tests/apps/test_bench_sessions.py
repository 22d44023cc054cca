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
    for sname in ("talk", "copy"):  # every width a mode used is priced, and each draft model
        cost = results["costs"][sname]
        used = {w for run in modes.values() for t in run[sname]["turns"] for w in t["pass_widths"]}
        assert used <= set(cost["target_s"]) and set(cost["draft_s"]) == {"mixed"}
        for row in rows[sname]:
            assert (row["priced_worst"] is not None) == ("K=auto" in row["mode"]), row["mode"]
        for t in modes["specx"][sname]["turns"]:  # the target alone: one token a pass
            assert t["pass_widths"] == {"1": t["target_passes"]} and t["draft_passes"] == 0
    report = format_sessions(results)
    assert "talk: 3 turns" in report and "best specx:" in report and "priced" in report


def test_a_turn_is_priced_by_its_passes_widths_and_its_draft_passes() -> None:
    from specx.apps.bench.session_costs import priced_ratio, worst_priced

    cost = {"target_s": {"1": 1.0, "3": 1.5, "5": 2.0}, "draft_s": {"d": 0.1}}
    turn = {"new_tokens": 10, "pass_widths": {"1": 2, "5": 2}, "draft_passes": 8}
    assert priced_ratio(turn, cost, "d") == 10 / (2 + 2 * 2.0 + 8 * 0.1)
    assert priced_ratio(turn, cost, None) == 10 / 6.0  # a lookup: no draft passes to pay
    alone = {"new_tokens": 7, "pass_widths": {"1": 7}, "draft_passes": 0}
    assert priced_ratio(alone, cost, None) == 1.0
    lost = {"new_tokens": 4, "pass_widths": {"3": 3, "1": 1}, "draft_passes": 0}  # 4 in 5.5
    run = {"drafter": "suffix+d", "turns": [turn, alone, lost]}
    assert worst_priced(run, cost) == 4 / 5.5
    unpriced = {"new_tokens": 4, "pass_widths": {"9": 1}, "draft_passes": 0}
    assert worst_priced({"drafter": "ngram", "turns": [alone, unpriced]}, cost) is None


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

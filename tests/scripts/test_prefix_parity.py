"""scripts/diagnostics/prefix_parity.py: warm and cold turns of a conversation compared."""

from __future__ import annotations

from conftest import TinyPair, load_script, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.prefix import PrefixConfig

pytestmark = needs_exporter


def test_it_counts_turns_and_parted_turns_with_their_gaps(llama_pair: TinyPair) -> None:
    script = load_script("prefix_parity")
    sessions = {"talk": {"max_new_tokens": 8, "system": "Be brief.", "turns": ["Hi", "Why?"]}}
    warm = Pipeline.load(llama_pair.artifact)
    cold = Pipeline.load(llama_pair.artifact, prefix=PrefixConfig(reuse=False))
    for drafter in ("none", "suffix"):
        report = script.compare(warm, cold, sessions, drafter, None)
        assert report["turns"] == 2
        assert len(report["gaps_at_parting"]) == report["parted"] <= 2
    ids = warm.encode_prompt("Hello there", chat=True).tolist()
    assert script.top_gap(cold, ids) >= 0.0

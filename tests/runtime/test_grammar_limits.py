"""The check a grammar passes before generation (runtime/grammar_limits.py): the matcher's limits
named in the refusal, wide parts of a schema probed wherever they nest, verdicts kept, and a
limit met during generation ending the sequence with its text so far."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter

pytest.importorskip("llguidance")

from specx.runtime import Grammar, InputError, Pipeline
from specx.runtime.grammar_limits import GrammarLimitError, GrammarLimits, wide_parts

pytestmark = needs_exporter


def wide(n: int = 600) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def test_wide_parts_are_found_wherever_they_nest_with_the_roots_definitions() -> None:
    schema = {
        "$defs": {"d": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"type": "array", "items": wide(70)}, "b": {"anyOf": [wide(65)]}},
        "enum": [wide(100)],  # values, not schemas
    }
    parts = wide_parts(schema)
    assert [p for p, _ in parts] == ["/properties/a/items", "/properties/b/anyOf/0"]
    assert all(part["$defs"] == schema["$defs"] for _, part in parts)
    assert wide_parts(wide(70)) == []  # the root is probed as a whole
    assert wide_parts({"properties": {"a/b": wide(70)}})[0][0] == "/properties/a~1b"


def test_a_wide_object_nested_deep_in_a_schema_is_refused_naming_where(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": wide()}}}
    with pytest.raises(GrammarLimitError, match=r"max_items_in_row.*at /properties/a/items"):
        pipe.constraint(Grammar.json_schema(nested))
    pipe.grammar_limits = GrammarLimits(max_items_in_row=4000)
    pipe.constraint(Grammar.json_schema(nested))  # served under a raised limit


def test_a_verdict_is_kept_and_a_kept_matcher_is_never_walked(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    tokenizer = pipe.grammar_tokenizer()
    grammar = Grammar.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    first = pipe.constraint(grammar)
    first.commit(np.flatnonzero(first.draft_allowed())[:1])  # the copy moves on
    again = pipe.constraint(grammar)
    assert np.array_equal(again.draft_allowed(), pipe.constraint(grammar).draft_allowed())
    assert len(tokenizer._checked) == 1
    with pytest.raises(InputError) as refused:
        pipe.constraint(Grammar.json_schema(wide()))
    with pytest.raises(InputError) as again_refused:
        pipe.constraint(Grammar.json_schema(wide()))
    assert again_refused.value is refused.value  # refused at once, from the kept verdict


def test_limits_must_be_non_negative_integers() -> None:
    with pytest.raises(InputError, match="max_items_in_row"):
        GrammarLimits(max_items_in_row=-1)


def test_a_limit_met_during_generation_ends_it_with_the_text_so_far_and_the_reason(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    pipe.grammar_limits = GrammarLimits(probe_walks=0)  # nothing foresees it
    result = pipe.generate(
        "The cat is", max_new_tokens=24, k=2, grammar=Grammar.json_schema(wide())
    )
    assert result.stats.stop_reason == "grammar"
    assert "max_items_in_row" in result.stats.stop_detail
    assert "generated tokens" in result.stats.stop_detail
    assert result.stats.to_json()["stop_detail"] == result.stats.stop_detail
    # the same generation with the probe on is refused before it starts
    pipe.grammar_limits = GrammarLimits()
    with pytest.raises(GrammarLimitError, match="before generation"):
        pipe.generate("The cat is", max_new_tokens=24, grammar=Grammar.json_schema(wide()))


def test_a_schema_nested_past_the_compilers_depth_is_refused_as_too_deep(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InputError, match="nested too deeply"):
        pipe.constraint(Grammar.json_schema(schema))
    deeper = '{"items": ' * 5000 + "{}" + "}" * 5000  # past Python's JSON reader too
    with pytest.raises(InputError, match="nested too deeply"):
        pipe.constraint(Grammar.json_schema(deeper))

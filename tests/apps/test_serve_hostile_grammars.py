"""Structured output under hostile input: every schema, grammar or tool list the matcher cannot
serve is a 400 naming its field (exit 2 in the CLI) before generation starts, a limit met midway
ends that request cleanly, and nothing is ever a 500 (runtime/grammar_limits.py)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import TinyPair, needs_exporter
from serve_tools import MODEL, client, serving

pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from specx.runtime.grammar_limits import GrammarLimits  # noqa: E402

pytestmark = needs_exporter

SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def many_properties(n: int) -> dict[str, Any]:
    """An object of n integer properties: compiles, then overflows a parser row at its first key
    once n is in the hundreds."""
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


WIDE = many_properties(600)
ASK = [{"role": "user", "content": "The cat is"}]


def started(pipe: Any) -> bool:
    """Whether any generation ran: each takes a workspace and gives it back when it ends."""
    return pipe.idle_workspaces(pipe.default_drafter) > 0


def schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def ask_json(api: Any, schema: Any, **extra: Any) -> Any:
    return api.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=24,
        temperature=0,
        response_format=schema_format(schema),
        **extra,
    )


def test_a_ref_that_only_refers_to_itself_is_a_400_naming_response_format(
    llama_pair: TinyPair,
) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        with pytest.raises(openai.BadRequestError) as refused:
            ask_json(client(base), SELF_REF)
        error = refused.value.body
        assert error["param"] == "response_format"
        assert "allows no text" in error["message"] and "$ref" in error["message"]
        assert not started(pipe)  # refused before generation


def test_an_object_too_wide_for_the_parser_is_refused_before_generation_naming_the_limit(
    llama_pair: TinyPair,
) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        with pytest.raises(openai.BadRequestError) as refused:
            ask_json(client(base), WIDE)
        error = refused.value.body
        assert error["param"] == "response_format"
        assert "max_items_in_row" in error["message"] and "before generation" in error["message"]
        assert "--grammar-row-items" in error["message"]
        assert not started(pipe)
        # a narrower object of the same kind is served
        reply = ask_json(client(base), many_properties(5))
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert started(pipe)  # the measure above can tell


def test_the_operator_can_raise_a_limit_so_the_same_schema_is_served(
    llama_pair: TinyPair,
) -> None:
    limits = GrammarLimits(max_items_in_row=4000)
    with serving(llama_pair.artifact, grammar_limits=limits) as (base, _server, _pipe):
        reply = ask_json(client(base), WIDE)
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_tool_whose_parameters_the_matcher_cannot_serve_is_named_by_its_index(
    llama_pair: TinyPair,
) -> None:
    ok = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": ok}},
        {"type": "function", "function": {"name": "wide", "parameters": WIDE}},
    ]
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        with pytest.raises(openai.BadRequestError) as refused:
            client(base).chat.completions.create(
                model=MODEL, messages=ASK, max_tokens=24, tools=tools, tool_choice="required"
            )
        assert refused.value.body["param"] == "tools[1].function.parameters"


def test_a_grammar_slower_than_the_timeout_is_a_400_while_other_requests_are_served(
    llama_pair: TinyPair,
) -> None:
    slow = many_properties(3000)  # seconds to compile on any machine
    with serving(llama_pair.artifact, grammar_timeout_s=0.05) as (base, _server, _pipe):
        api = client(base)
        with ThreadPoolExecutor(2) as pool:
            hostile = pool.submit(ask_json, api, slow)
            time.sleep(0.01)
            plain = api.completions.create(model=MODEL, prompt="The cat", max_tokens=4)
            assert plain.choices[0].text is not None
            with pytest.raises(openai.BadRequestError) as refused:
                hostile.result()
        assert "took longer than 0.05 s" in refused.value.body["message"]
        assert refused.value.body["param"] == "response_format"


def test_a_limit_met_during_generation_ends_the_request_with_a_400_or_an_error_event(
    llama_pair: TinyPair,
) -> None:
    # no probe: the wide object passes the checks and fails at its first key, mid-request
    limits = GrammarLimits(probe_walks=0)
    with serving(llama_pair.artifact, grammar_limits=limits) as (base, _server, pipe):
        api = client(base)
        with pytest.raises(openai.BadRequestError) as refused:
            ask_json(api, WIDE)
        error = refused.value.body
        assert error["param"] == "response_format"
        assert "max_items_in_row" in error["message"] and "generated tokens" in error["message"]
        assert started(pipe)  # it did start, and gave its workspace back
        with pytest.raises(openai.APIError) as streamed:
            for _chunk in ask_json(api, WIDE, stream=True):
                pass
        assert "max_items_in_row" in str(streamed.value)
        assert api.models.list().data  # still serving


def test_one_hostile_request_in_a_batch_leaves_the_others_outputs_as_they_are_alone(
    batched_llama: Any,
) -> None:
    from batch_tools import PROMPTS
    from specx.runtime import Pipeline

    artifact, _ = batched_llama
    alone = Pipeline.load(artifact)
    want = [alone.generate(p, max_new_tokens=16, k=3, drafter="mixed").text for p in PROMPTS[:3]]
    limits = GrammarLimits(probe_walks=0)  # the hostile one fails midway, inside the batch
    config = {"grammar_limits": limits, "max_concurrency": 4}
    with serving(artifact, batch=4, **config) as (base, _server, pipe):
        api = client(base)

        def ordinary(prompt: str) -> str:
            out = api.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=16,
                temperature=0,
                extra_body={"k": 3, "drafter": "mixed"},
            )
            return str(out.choices[0].text)

        def hostile() -> Any:
            try:
                return ask_json(api, WIDE, extra_body={"k": 3, "drafter": "mixed"})
            except openai.BadRequestError as e:
                return e

        with ThreadPoolExecutor(4) as pool:
            refused = pool.submit(hostile)
            got = list(pool.map(ordinary, PROMPTS[:3]))
        assert got == want
        assert isinstance(refused.result(), openai.BadRequestError)
        assert max(pipe.batching.decoder.rows_per_pass) > 1


def test_run_exits_2_with_the_limit_named_for_a_schema_the_matcher_cannot_serve(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from specx.apps.cli.main import main

    for schema, words in ((WIDE, "max_items_in_row"), (SELF_REF, "allows no text")):
        path = tmp_path / "schema.json"
        path.write_text(json.dumps(schema))
        args = ["run", str(llama_pair.artifact), "--prompt", "x", "--json-schema", str(path)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert words in result.output and "Traceback" not in result.output

"""`specx serve` and the official `openai` client: response_format (JSON object, JSON Schema),
tools (forced and automatic calls, a tool-result turn), logprobs (chat and completions, streamed
or not), each checked against what the pipeline computes alone."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from serve_tools import MODEL, client, serving

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from specx.runtime import Grammar, Pipeline  # noqa: E402
from specx.runtime.verification.logprobs import log_distribution  # noqa: E402
from specx.runtime.verification.sampling import SamplingParams  # noqa: E402

pytestmark = [needs_exporter, pytest.mark.usefixtures("short_whitespace")]


@pytest.fixture
def short_whitespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A random-weight model picks whitespace as readily as anything else: at most two
    characters per gap, or its JSON would not end within the tiny models' 128 positions."""
    from specx.runtime import constraint

    monkeypatch.setitem(constraint.JSON_LAYOUT, "whitespace_pattern", r"[\n ]{0,2}")


ITEM = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green"]},
    },
    "required": ["id", "ok", "tag"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "The cat is"}]


def test_response_format_json_schema_gives_valid_json_equal_to_the_pipelines(
    llama_pair: TinyPair,
) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        api = client(base)
        fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM}}
        reply = api.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=100, temperature=0, response_format=fmt
        )
        text = reply.choices[0].message.content
        jsonschema.validate(json.loads(text), ITEM)
        assert reply.choices[0].finish_reason == "stop"
        alone = pipe.generate(
            "The cat is", chat=True, max_new_tokens=100, k=0, grammar=Grammar.json_schema(ITEM)
        )
        assert text == alone.text  # speculative over HTTP = the constrained target alone
        streamed = "".join(
            e.choices[0].delta.content or ""
            for e in api.chat.completions.create(
                model=MODEL,
                messages=ASK,
                max_tokens=100,
                temperature=0,
                response_format=fmt,
                stream=True,
            )
            if e.choices
        )
        assert streamed == text
        # the completions endpoint takes it too, sampled: every seed valid
        for seed in range(5):
            done = api.completions.create(
                model=MODEL,
                prompt="{",
                max_tokens=100,
                temperature=1,
                seed=seed,
                extra_body={"response_format": fmt},
            )
            jsonschema.validate(json.loads(done.choices[0].text), ITEM)


def test_json_object_mode_returns_an_object(llama_pair: TinyPair) -> None:
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        finished = 0
        for seed in range(6):  # a random model's strings run long: keep those that end
            reply = client(base).chat.completions.create(
                model=MODEL,
                messages=ASK,
                max_tokens=110,
                temperature=1,
                seed=seed,
                response_format={"type": "json_object"},
            )
            if reply.choices[0].finish_reason == "stop":
                finished += 1
                assert isinstance(json.loads(reply.choices[0].message.content), dict)
        assert finished


def test_a_forced_tool_call_comes_back_as_tool_calls_with_valid_arguments(
    llama_pair: TinyPair,
) -> None:
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        api = client(base)
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            for stream in (False, True):
                kwargs: dict[str, Any] = dict(
                    model=MODEL,
                    messages=ASK,
                    max_tokens=100,
                    temperature=0,
                    tools=[WEATHER],
                    tool_choice=choice,
                )
                if stream:
                    events = list(api.chat.completions.create(stream=True, **kwargs))
                    deltas = [e.choices[0].delta for e in events if e.choices]
                    calls = [c for d in deltas for c in (d.tool_calls or [])]
                    reasons = [e.choices[0].finish_reason for e in events if e.choices]
                    assert reasons[-1] == "tool_calls"
                    name, arguments = calls[0].function.name, calls[0].function.arguments
                else:
                    reply = api.chat.completions.create(**kwargs)
                    message = reply.choices[0].message
                    assert reply.choices[0].finish_reason == "tool_calls"
                    assert message.content is None
                    call = message.tool_calls[0]
                    assert call.type == "function" and call.id.startswith("call_")
                    name, arguments = call.function.name, call.function.arguments
                assert name == "get_weather"
                jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
        # the conversation goes on: the call and its result are turns of the template
        history = [
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Oslo", "days": 2}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        reply = api.chat.completions.create(
            model=MODEL, messages=history, max_tokens=8, temperature=0, tools=[WEATHER]
        )
        assert reply.choices[0].finish_reason in ("length", "stop")


def test_tools_reach_the_chat_template(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    pipe.codec.chat_template = (
        "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert pipe.codec.render_chat(ASK, tools=[WEATHER]) == "[get_weather]The cat is"


def test_tool_calls_are_read_back_from_tagged_or_plain_json_text() -> None:
    from specx.apps.serve.structured import Tools, read_tool_calls

    tools = Tools((WEATHER,), "auto")
    content, calls = read_tool_calls(
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
        '"days": 1}}\n</tool_call>',
        tools,
    )
    assert content == "Let me look." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 1}
    content, calls = read_tool_calls('{"name": "get_weather", "arguments": {}}', tools)
    assert content is None and len(calls) == 1
    # the braces as Qwen2.5-Coder's template shows the format (and the model copies them)
    content, calls = read_tool_calls(
        '{{"name": "get_weather", "arguments": {"city": "Rome"}}}', tools
    )
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}
    assert read_tool_calls("{{not json}}", tools) == ("{{not json}}", [])
    content, calls = read_tool_calls(
        '```json\n{"name": "get_weather", "arguments": {}}\n```', tools
    )
    assert content is None and calls[0]["function"]["name"] == "get_weather"
    assert read_tool_calls('{"name": "other", "arguments": {}}', tools) == (
        '{"name": "other", "arguments": {}}',
        [],
    )
    assert read_tool_calls("just text", Tools((WEATHER,), "none")) == ("just text", [])
    tagged = Tools((WEATHER,), "required").grammar(json.dumps)
    assert tagged is not None and tagged.kind == "lark" and '"<tool_call>"' in tagged.source
    plain = Tools((WEATHER,), "required").grammar(None)
    assert plain is not None and plain.kind == "json_schema"


def target_alone_logprobs(
    pipe: Pipeline, prompt: np.ndarray, tokens: list[int], params: SamplingParams
) -> np.ndarray:
    """[n, vocab] the target's log-distributions of each emitted token, one pass at a time."""
    session = pipe.target.fork()
    cache = session.new_cache(pipe.manifest.max_length)
    rows = []
    logits = session.prefill(prompt, cache)
    for token in tokens:
        rows.append(log_distribution(np.asarray(logits)[None], params)[0])
        logits = session.forward(np.array([token]), cache)[-1]
    return np.stack(rows)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_equal_the_target_alones_streamed_or_not(
    llama_pair: TinyPair, temperature: float
) -> None:
    with serving(llama_pair.artifact) as (base, _server, pipe):
        api = client(base)
        reply = api.chat.completions.create(
            model=MODEL,
            messages=ASK,
            max_tokens=20,
            temperature=temperature,
            seed=3,
            logprobs=True,
            top_logprobs=3,
            extra_body={"k": 4},
        )
        content = reply.choices[0].logprobs.content
        text = reply.choices[0].message.content
        joined = b"".join(bytes(c.bytes) for c in content)  # bytes: a token may split a char
        assert joined.decode("utf-8", errors="replace") == text
        prompt = pipe.codec.encode_messages(ASK)
        ids = [
            t
            for t in pipe.generate(
                ASK[0]["content"],
                chat=True,
                max_new_tokens=20,
                temperature=temperature,
                seed=3,
                k=4,
            ).token_ids
        ]
        params = SamplingParams(temperature=temperature)
        want = target_alone_logprobs(pipe, prompt, ids, params)  # [n, vocab]
        special = pipe.codec.special_ids  # not text: no logprobs listed
        text_rows = [i for i, t in enumerate(ids) if t not in special]
        want, ids = want[text_rows], [ids[i] for i in text_rows]
        assert len(content) == len(ids)
        for i, c in enumerate(content):
            assert math.isclose(c.logprob, want[i, ids[i]], abs_tol=1e-4)
            assert len(c.top_logprobs) == 3
            best = np.sort(want[i])[::-1][:3]
            assert np.allclose([t.logprob for t in c.top_logprobs], best, atol=1e-4)
            assert c.top_logprobs[0].logprob >= c.logprob - 1e-6
            assert bytes(c.bytes).decode("utf-8", errors="replace") == c.token
        streamed = [
            c
            for e in api.chat.completions.create(
                model=MODEL,
                messages=ASK,
                max_tokens=20,
                temperature=temperature,
                seed=3,
                logprobs=True,
                top_logprobs=3,
                stream=True,
                extra_body={"k": 4},
            )
            if e.choices and e.choices[0].logprobs
            for c in e.choices[0].logprobs.content
        ]
        assert [c.logprob for c in streamed] == [c.logprob for c in content]
        legacy = api.completions.create(
            model=MODEL,
            prompt="The cat is",
            max_tokens=10,
            temperature=temperature,
            seed=3,
            logprobs=2,
        ).choices[0]
        assert len(legacy.logprobs.tokens) == len(legacy.logprobs.token_logprobs) > 0
        assert len(legacy.logprobs.top_logprobs[0]) == 2
        assert legacy.logprobs.text_offset[0] == 0


def test_without_logprobs_the_reply_has_none(llama_pair: TinyPair) -> None:
    with serving(llama_pair.artifact) as (base, _server, _pipe):
        reply = client(base).chat.completions.create(model=MODEL, messages=ASK, max_tokens=5)
        assert reply.choices[0].logprobs is None

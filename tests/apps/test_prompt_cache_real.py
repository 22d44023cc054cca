"""Prompt reuse on the real models: a three-turn chat through `specx serve` (SmolLM2) and the
Python API (the Qwen pair on the specx kernels) keeps each turn's conversation for the next one,
and answers what a cold start answers. Runs where the test command fetched the models."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import needs_exporter
from serve_tools import MODEL, serving
from specx.runtime import Pipeline
from specx.runtime.prefix import PrefixConfig

openai = pytest.importorskip("openai")
pytestmark = [needs_exporter, pytest.mark.slow]

QUESTIONS = [
    "Write a Python function that returns the squares of a list of numbers.",
    "Now make it skip negative numbers.",
    "Add a docstring to it.",
]
TIE = 1e-3  # a top-2 logit gap this small is a float near-tie on ONNX Runtime's kernels


def chat(api: Any, n: int = 48) -> list[Any]:
    messages: list[dict[str, str]] = []
    replies = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        reply = api.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=n, temperature=0
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        replies.append(reply)
    return replies


def top_gap(pipe: Pipeline, ids: list[int]) -> float:
    """The target's top-2 logit gap after `ids` (read cold, in one prompt pass)."""
    target = pipe.target.fork()
    cache = target.new_cache(len(ids) + 1)
    target.prefill(np.asarray(ids[:-1], np.int64), cache)
    row = np.sort(target.forward(np.asarray(ids[-1:], np.int64), cache)[-1])
    return float(row[-1] - row[-2])


def test_a_smollm2_chat_over_http_keeps_each_turn_and_answers_as_a_cold_server(
    smollm2_artifact: Path,
) -> None:
    """On ONNX Runtime's kernels a kept position may differ from a recomputed one in the last
    bits: the answers may part only at a float near-tie (docs/models-and-drafters.md)."""
    with serving(smollm2_artifact) as (base, _server, pipe):
        warm = chat(openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0))
    with serving(smollm2_artifact, prefix=PrefixConfig(reuse=False)) as (base, _s, _p):
        cold = chat(openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0))
    for before, reply in itertools.pairwise(warm):
        cached = reply.usage.prompt_tokens_details.cached_tokens
        # the previous prompt and answer, but the answer's end token and the template's
        # re-rendered seam after it
        kept = before.usage.prompt_tokens + before.usage.completion_tokens - 3
        assert cached >= kept, (cached, kept)
    texts = (
        [r.choices[0].message.content for r in warm],
        [r.choices[0].message.content for r in cold],
    )
    if texts[0] != texts[1]:  # where they part, the cold target must be at a near-tie
        turn = next(i for i, (a, b) in enumerate(zip(*texts, strict=True)) if a != b)
        messages: list[dict[str, str]] = []
        for i in range(turn):
            messages += [
                {"role": "user", "content": QUESTIONS[i]},
                {"role": "assistant", "content": texts[1][i]},
            ]
        messages.append({"role": "user", "content": QUESTIONS[turn]})
        prompt = pipe.codec.encode_messages(messages).tolist()
        a, b = (pipe.codec.encode(t[turn], add_special_tokens=False).tolist() for t in texts)
        at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        assert top_gap(pipe, prompt + b[:at]) < TIE


def test_a_qwen_conversation_on_the_specx_kernels_keeps_the_cold_bits(
    qwen_artifact: Path,
) -> None:
    warm_pipe = Pipeline.load(qwen_artifact)
    cold_pipe = Pipeline.load(qwen_artifact, prefix=PrefixConfig(reuse=False))
    runs = []
    for pipe in (warm_pipe, cold_pipe):
        messages: list[dict[str, str]] = []
        results = []
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            ids = pipe.codec.encode_messages(messages)
            result = pipe.generate(ids, max_new_tokens=40, k="auto", drafter="suffix+draft")
            messages.append({"role": "assistant", "content": result.text})
            results.append(result)
        runs.append(results)
    warm, cold = runs
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    for before, result in itertools.pairwise(warm):
        kept = len(before.prompt_token_ids) + len(before.token_ids) - 3
        assert result.stats.reused_prompt_tokens >= kept
    (workspace,) = warm_pipe.workspaces.idle("suffix+draft")
    (other,) = cold_pipe.workspaces.idle("suffix+draft")
    n = min(workspace.cache.length, other.cache.length)
    kept_bits = [v.tobytes() for v in workspace.cache.read_positions(0, 0, n)]
    assert kept_bits == [v.tobytes() for v in other.cache.read_positions(0, 0, n)]

"""`specx serve` keeps each conversation's prompt between requests (runtime/prefix): a later turn
reports the kept positions as OpenAI does (usage.prompt_tokens_details.cached_tokens), answers
what a server that reads every prompt whole answers, never reuses another API key's or another
cache_salt's prompt, and counts its hits and store in /metrics."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conftest import TinyPair, needs_exporter
from serve_tools import MODEL, serving

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from specx.runtime.prefix import PrefixConfig  # noqa: E402

pytestmark = needs_exporter

QUESTIONS = ["Cats?", "Dogs?", "Why?"]  # short: the tiny models hold 96..128 positions


def chat_turns(api: Any, extra: dict[str, Any], n: int = 6) -> list[Any]:
    """Three chat turns, each sending the whole conversation so far, as a client does."""
    messages: list[dict[str, str]] = []
    replies = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        reply = api.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=n, temperature=0, extra_body=extra
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        replies.append(reply)
    return replies


def api_for(base: str, key: str = "unused") -> Any:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.mark.parametrize("batch", [0, 2], ids=["alone", "batched"])
@pytest.mark.parametrize(
    "extra", [{"k": 0}, {"k": "auto", "drafter": "ngram"}, {"k": 3, "drafter": "mixed"}]
)
def test_a_conversation_reads_only_its_new_turn_and_answers_as_without_reuse(
    llama_pair: TinyPair, batched_llama: Any, batch: int, extra: dict[str, Any]
) -> None:
    artifact = batched_llama[0] if batch else llama_pair.artifact
    cold_config = PrefixConfig(reuse=False)
    with serving(artifact, batch=batch, context=128) as (base, _server, _pipe):
        warm = chat_turns(api_for(base), extra)
        metrics = httpx.get(base + "/metrics", timeout=30).text
    with serving(artifact, batch=batch, prefix=cold_config, context=128) as (base, _s, _p):
        cold = chat_turns(api_for(base), extra)
    assert [r.choices[0].message.content for r in warm] == [
        r.choices[0].message.content for r in cold
    ]
    assert warm[0].usage.prompt_tokens_details.cached_tokens == 0
    for before, reply in itertools.pairwise(warm):
        cached = reply.usage.prompt_tokens_details.cached_tokens
        # at least the whole previous prompt (the template renders it the same way again)
        assert cached >= before.usage.prompt_tokens
        assert cached < reply.usage.prompt_tokens
    assert all(r.usage.prompt_tokens_details.cached_tokens == 0 for r in cold)
    assert 'specx_prompt_cache_hits_total{source="cache"} 2.0' in metrics
    kept = sum(r.usage.prompt_tokens_details.cached_tokens for r in warm)
    assert f"specx_prompt_cache_tokens_total {float(kept)}" in metrics


def test_another_api_key_or_cache_salt_never_gets_a_hit(llama_pair: TinyPair) -> None:
    """A hit shows in the time to the first token: tenant B must never learn what tenant A
    sent. Prefixes are scoped per API key, and a cache_salt narrows a key's scope."""
    keys = ("key-a", "key-b")
    prompt = "The quick brown fox jumps over the lazy dog."

    def cached(api: Any, text: str, salt: str | None = None) -> int:
        extra = {"cache_salt": salt} if salt is not None else {}
        reply = api.completions.create(
            model=MODEL, prompt=text, max_tokens=4, temperature=0, extra_body=extra
        )
        return int(reply.usage.prompt_tokens_details.cached_tokens)

    with serving(llama_pair.artifact, api_keys=keys) as (base, _server, _pipe):
        a, b = api_for(base, "key-a"), api_for(base, "key-b")
        assert cached(a, prompt) == 0
        assert cached(b, prompt + "More.") == 0  # key A's prompt, sent by key B
        assert cached(a, prompt + "More.") > 0  # key A: from the store (B took the cache)
        assert cached(a, prompt + "Other.", salt="s1") == 0  # a salt: another scope
        assert cached(a, prompt + "Other. Again.", salt="s1") > 0
        assert cached(a, prompt + "Other. Again.", salt="s2") == 0
        bad = httpx.post(
            base + "/v1/completions",
            json={"prompt": "a", "cache_salt": 7},
            headers={"Authorization": "Bearer key-a"},
            timeout=30,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"
        metrics = httpx.get(base + "/metrics", timeout=30).text
    assert 'specx_prompt_cache_store_events{event="saved"}' in metrics
    assert "specx_prompt_cache_store_bytes" in metrics

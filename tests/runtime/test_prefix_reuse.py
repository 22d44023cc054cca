"""Prompt reuse across generations (runtime/prefix): a later turn of a conversation keeps the
prefix its cache holds and reads only the rest, and gives the tokens a cold start gives.

A conversation here is raw ids: each turn's prompt is the previous prompt, the previous answer
and a few new ids, so the cache of turn n holds all of turn n + 1's prompt up to the new ids but
its answer's last token (a cache holds every committed token but the last)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import GenerationResult, Pipeline
from specx.runtime.prefix import PrefixConfig

pytestmark = needs_exporter

COLD = PrefixConfig(reuse=False)

Generate = Callable[[np.ndarray], GenerationResult]


def new_ids(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 300, size=n).astype(np.int64)


def conversation(generate: Generate, turns: int = 3, seed: int = 0) -> list[GenerationResult]:
    """`turns` turns: each prompt = the last prompt + its answer + 6 new ids."""
    results: list[GenerationResult] = []
    prompt = new_ids(seed, 9)
    for turn in range(turns):
        if results:
            answer = np.asarray(results[-1].token_ids, np.int64)
            prompt = np.concatenate([prompt, answer, new_ids(seed + 100 + turn, 6)])
        results.append(generate(prompt))
    return results


def expected_reuse(results: list[GenerationResult], turn: int) -> int:
    """What turn `turn` can keep: the previous turn's prompt and answer but its last token."""
    previous = results[turn - 1]
    return len(previous.prompt_token_ids) + len(previous.token_ids) - 1


SETTINGS = [
    {"k": 0},
    {"k": 3, "drafter": "mixed"},
    {"k": 4, "drafter": "ngram"},
    {"k": 4, "drafter": "suffix"},
    {"k": 2, "drafter": "ngram+other"},
    {"k": 3, "drafter": "suffix+mixed"},
    {"k": "auto", "drafter": "mixed"},
    {"k": 3, "drafter": "mixed", "temperature": 0.9, "seed": 11},
    {"k": 2, "drafter": "other", "temperature": 1.0, "seed": 5, "verification": "rejection"},
]


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: "-".join(map(str, o.values())))
def test_a_later_turn_keeps_the_conversation_so_far_and_gives_the_cold_tokens(
    llama_pair: TinyPair, options: dict[str, Any]
) -> None:
    warm_pipe = Pipeline.load(llama_pair.artifact)
    cold_pipe = Pipeline.load(llama_pair.artifact, prefix=COLD)
    warm = conversation(lambda p: warm_pipe.generate(p, max_new_tokens=14, **options))
    cold = conversation(lambda p: cold_pipe.generate(p, max_new_tokens=14, **options))
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    assert warm[0].stats.reused_prompt_tokens == 0
    for turn in (1, 2):
        stats = warm[turn].stats
        assert stats.reused_prompt_tokens == expected_reuse(warm, turn)
        assert stats.prompt_cache == "cache"
        assert cold[turn].stats.reused_prompt_tokens == 0
        assert cold[turn].stats.prompt_cache_note == "prompt reuse is off"


def test_a_conversation_whose_cache_went_to_another_comes_back_from_the_store(
    llama_pair: TinyPair,
) -> None:
    """One workspace, two conversations taking turns: each turn finds its conversation in the
    host store (the workspace's cache holds the other one), for the target and the draft."""
    pipe = Pipeline.load(llama_pair.artifact)
    cold_pipe = Pipeline.load(llama_pair.artifact, prefix=COLD)
    options = {"max_new_tokens": 14, "k": 3, "drafter": "mixed"}
    a, b = (iter(_turn_prompts(seed)) for seed in (1, 2))
    warm, cold = [], []
    prompts = [next(a), next(b), None, None]
    for i, name in enumerate("abab"):
        source = a if name == "a" else b
        prompt = prompts[i] if prompts[i] is not None else source.send(warm[i - 2])
        warm.append(pipe.generate(prompt, **options))
        cold.append(cold_pipe.generate(prompt, **options))
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    assert pipe.idle_workspaces("mixed") == 1
    for turn in (2, 3):
        stats = warm[turn].stats
        assert stats.prompt_cache == "store"
        assert stats.reused_prompt_tokens == expected_reuse([warm[turn - 2]], 1)
    store = pipe.prefixes.store
    assert store is not None and store.counts.hits >= 4  # target and draft, two turns each
    assert store.counts.corrupt == 0


def _turn_prompts(seed: int) -> Any:
    """A generator of a conversation's prompts: send it each answer's result for the next."""
    prompt = new_ids(seed, 9)
    turn = 0
    while True:
        result = yield prompt
        turn += 1
        answer = np.asarray(result.token_ids, np.int64)
        prompt = np.concatenate([prompt, answer, new_ids(seed + 100 + turn, 6)])


def test_another_scope_never_reuses_a_prompt_and_no_scope_leaves_nothing(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = new_ids(3, 20)
    first = pipe.generate(prompt, max_new_tokens=8, k=0, cache_scope="tenant-a")
    again = np.concatenate([prompt, np.asarray(first.token_ids), new_ids(4, 3)])
    other = pipe.generate(again, max_new_tokens=8, k=0, cache_scope="tenant-b")
    assert other.stats.reused_prompt_tokens == 0 and other.stats.prompt_cache == ""
    # tenant-a's prefix went to the store when tenant-b took the cache: still a's alone
    mine = pipe.generate(again, max_new_tokens=8, k=0, cache_scope="tenant-a")
    assert mine.stats.prompt_cache == "store"
    assert mine.stats.reused_prompt_tokens == len(prompt) + len(first.token_ids) - 1
    assert mine.token_ids == other.token_ids
    # a generation without a scope neither reuses nor leaves a prefix for anyone
    none = pipe.generate(again, max_new_tokens=8, k=0, cache_scope=None)
    assert none.stats.reused_prompt_tokens == 0
    after = pipe.generate(again, max_new_tokens=8, k=0, cache_scope="tenant-b")
    assert after.stats.prompt_cache != "cache"


def test_a_corrupted_store_entry_is_caught_and_never_served(llama_pair: TinyPair) -> None:
    """The negative control of the store: flipping one value of a stored prefix fails its
    checksum; the entry is dropped, the prompt is read whole, the tokens stay the cold ones."""
    pipe = Pipeline.load(llama_pair.artifact)
    a = _turn_prompts(7)
    first_prompt = next(a)
    first = pipe.generate(first_prompt, max_new_tokens=12, k=0)
    pipe.generate(new_ids(8, 30), max_new_tokens=12, k=0)  # another prompt takes the cache
    store = pipe.prefixes.store
    assert store is not None and len(store) == 1
    (entry,) = store._entries.values()
    entry.values[0][0, 3, 0] += 1.0  # one value of position 3 of layer 0's keys
    second = a.send(first)
    warm = pipe.generate(second, max_new_tokens=12, k=0)
    cold = Pipeline.load(llama_pair.artifact, prefix=COLD).generate(second, max_new_tokens=12, k=0)
    assert store.counts.corrupt == 1 and len(store) == 1  # only the other prompt's entry left
    assert warm.stats.reused_prompt_tokens == 0
    assert warm.token_ids == cold.token_ids


def test_the_warm_equals_cold_check_fails_when_a_kept_prefix_is_wrong(
    llama_pair: TinyPair,
) -> None:
    """The negative control of the equality tests: corrupt the keys a cache keeps (as a bug
    keeping the wrong prefix would) and the warm tokens part from the cold ones."""
    pipe = Pipeline.load(llama_pair.artifact)
    a = _turn_prompts(9)
    first = pipe.generate(next(a), max_new_tokens=12, k=0)
    (workspace,) = pipe.workspaces.idle("none")
    for buffer in workspace.cache._buffers:
        buffer.to_host()[...] *= -3.0  # every kept key and value
    second = a.send(first)
    warm = pipe.generate(second, max_new_tokens=12, k=0)
    cold = Pipeline.load(llama_pair.artifact, prefix=COLD).generate(second, max_new_tokens=12, k=0)
    assert warm.stats.reused_prompt_tokens > 0
    assert warm.token_ids != cold.token_ids


def test_a_draft_model_keeps_its_prefix_and_reads_only_the_rest(llama_pair: TinyPair) -> None:
    from specx.runtime.drafters.base import DraftRequest
    from specx.runtime.drafters.model import ModelDrafter
    from specx.runtime.verification.sampling import PositionNoise, SamplingParams

    pipe = Pipeline.load(llama_pair.artifact)
    drafter = pipe.new_drafter("mixed")
    assert isinstance(drafter, ModelDrafter)
    noise = PositionNoise(0, pipe.manifest.target.vocab_size)
    request = DraftRequest(SamplingParams(), noise, scope="", prefixes=pipe.prefixes)
    prompt = new_ids(12, 40)
    drafter.start(prompt, request)
    passes = drafter.session.passes
    longer = np.concatenate([prompt, new_ids(13, 5)])
    drafter.start(longer, request)
    assert drafter.cache.length == len(longer) - 1
    assert drafter.session.passes == passes + 1  # one pass over the 5 new tokens
    assert drafter.cache.held().tolist() == longer[:-1].tolist()
    drafter.start(longer, DraftRequest(SamplingParams(), noise, scope="x", prefixes=None))
    assert drafter.session.passes == passes + 2 + (len(longer) - 2) // 128  # another scope


@pytest.mark.parametrize(
    "options",
    [{"k": 0}, {"k": 3, "drafter": "mixed"}, {"k": "auto", "drafter": "ngram"}],
    ids=["alone", "mixed", "ngram-auto"],
)
def test_a_batch_row_keeps_a_conversation_between_requests(
    batched_llama: Any, options: dict[str, Any]
) -> None:
    """With batching on, each turn runs as a batch row: the row it leaves keeps the
    conversation, and the next turn takes that row (draft row included) and reads the rest."""
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    pipe.enable_batching(max_batch=2, context=128)
    cold_pipe = Pipeline.load(artifact, prefix=COLD)
    cold_pipe.enable_batching(max_batch=2, context=128)
    try:
        warm = conversation(lambda p: pipe.generate(p, max_new_tokens=14, **options))
        cold = conversation(lambda p: cold_pipe.generate(p, max_new_tokens=14, **options))
    finally:
        pipe.disable_batching()
        cold_pipe.disable_batching()
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    for turn in (1, 2):
        assert warm[turn].stats.reused_prompt_tokens == expected_reuse(warm, turn)
        assert warm[turn].stats.prompt_cache == "cache"
        assert cold[turn].stats.reused_prompt_tokens == 0


def test_generate_batch_finds_the_last_batch_s_conversations_in_the_store(
    batched_llama: Any,
) -> None:
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    cold_pipe = Pipeline.load(artifact, prefix=COLD)
    options = {"max_new_tokens": 12, "k": 2, "drafter": "mixed"}
    firsts = [new_ids(20 + i, 10 + i) for i in range(3)]
    turn1 = pipe.generate_batch(firsts, max_batch=3, **options)
    seconds = [
        np.concatenate([p, np.asarray(r.token_ids), new_ids(30 + i, 4)])
        for i, (p, r) in enumerate(zip(firsts, turn1, strict=True))
    ]
    warm = pipe.generate_batch(seconds, max_batch=3, **options)
    cold = cold_pipe.generate_batch(seconds, max_batch=3, **options)
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    for first, result in zip(turn1, warm, strict=True):
        assert result.stats.prompt_cache == "store"
        assert result.stats.reused_prompt_tokens == expected_reuse([first], 1)


@pytest.fixture(scope="module")
def kernel_pair(tmp_path_factory: Any) -> Any:
    """A tiny qwen2 pair as int4 graphs on the specx kernels (GGUF blocks as stored)."""
    from kernel_tools import export_qwen2_int4

    folder = tmp_path_factory.mktemp("kernel-gguf")
    return export_qwen2_int4(folder, seed=0, draft=True, batched=True, max_length=128)


def _kept_bytes(pipe: Pipeline, drafter: str) -> list[bytes]:
    """The bytes of every position the idle workspace's target cache holds."""
    (workspace,) = pipe.workspaces.idle(drafter)
    cache = workspace.cache
    return [v.tobytes() for v in cache.read_positions(0, 0, cache.length)]


@pytest.mark.parametrize(
    "options",
    [{"k": 0}, {"k": 3, "drafter": "draft"}, {"k": 5, "drafter": "ngram"}],
    ids=["alone", "draft", "ngram"],
)
def test_on_the_specx_kernels_a_kept_prefix_holds_the_cold_bits(
    kernel_pair: Any, options: dict[str, Any]
) -> None:
    """On the specx kernels a position's keys and values do not depend on the pass that
    computed them (a verify pass, a prompt chunk): a warm turn's cache holds the bits a cold
    turn's does, and its tokens are the cold ones."""
    warm_pipe = Pipeline.load(kernel_pair)
    cold_pipe = Pipeline.load(kernel_pair, prefix=COLD)
    warm = conversation(lambda p: warm_pipe.generate(p, max_new_tokens=16, **options), seed=4)
    cold = conversation(lambda p: cold_pipe.generate(p, max_new_tokens=16, **options), seed=4)
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    assert warm[2].stats.reused_prompt_tokens == expected_reuse(warm, 2) > 0
    drafter = warm[2].stats.drafter
    assert _kept_bytes(warm_pipe, drafter) == _kept_bytes(cold_pipe, drafter)


def test_on_the_specx_kernels_a_batch_row_keeps_the_cold_bits(kernel_pair: Any) -> None:
    """The same through batch rows (the batched graph and the gqa graph share them)."""
    pipes = [Pipeline.load(kernel_pair), Pipeline.load(kernel_pair, prefix=COLD)]
    runs = []
    for pipe in pipes:
        pipe.enable_batching(max_batch=2, context=128)
        try:
            runs.append(conversation(lambda p, pipe=pipe: pipe.generate(p, max_new_tokens=14, k=0)))
        finally:
            pipe.disable_batching()
    warm, cold = runs
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    assert warm[2].stats.prompt_cache == "cache"


def _rss_bytes() -> int:
    import os

    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_store_holds_memory_within_its_bound_however_much_goes_through_it() -> None:
    """300 prefixes of 4 MB through a 64 MB store: it keeps the most recent that fit, and the
    process's resident memory grows by about the bound, not by what went through."""
    from specx.runtime.prefix.store import PrefixStore

    limit = 64 * 2**20
    store = PrefixStore(limit)
    rng = np.random.default_rng(0)
    before = _rss_bytes()
    for i in range(300):
        tokens = np.concatenate([[i], rng.integers(0, 1000, size=1023)]).astype(np.int64)
        values = [rng.standard_normal((4, 1024, 64), dtype=np.float32) for _ in range(4)]
        store.put("graph", "", tokens, values)
        assert store.nbytes <= limit
    grown = _rss_bytes() - before
    assert grown < limit + 48 * 2**20, grown / 2**20
    assert store.counts.saved == 300 and store.counts.evicted > 250
    assert len(store) == limit // (4 * 4 * 1024 * 64 * 4 + 8 * 1024)


def test_many_conversations_through_a_small_store_are_never_served_wrong(
    long_pair: TinyPair,
) -> None:
    """Forty conversations taking turns through one workspace and a 1 MB store (a conversation
    of a thousand tokens takes half of it): the store stays within its bound, serves the ones it
    still holds, and every turn's tokens are the cold ones."""
    pipe = Pipeline.load(long_pair.artifact, prefix=PrefixConfig(store_mb=1))
    cold_pipe = Pipeline.load(long_pair.artifact, prefix=COLD)
    rng = np.random.default_rng(1)
    prompts = {c: rng.integers(3, 300, size=int(rng.integers(200, 900))) for c in range(40)}
    answers: dict[int, list[int]] = {}
    sources = []
    for turn in range(2):
        for c in rng.permutation(40):
            if turn:
                prompts[c] = np.concatenate([prompts[c], answers[c], rng.integers(3, 300, 5)])
            warm = pipe.generate(prompts[c], max_new_tokens=6, k=0)
            cold = cold_pipe.generate(prompts[c], max_new_tokens=6, k=0)
            assert warm.token_ids == cold.token_ids
            answers[c] = warm.token_ids
            sources.append(warm.stats.prompt_cache)
            store = pipe.prefixes.store
            assert store is not None and store.nbytes <= 2**20
    assert store.counts.evicted > 0 and store.counts.corrupt == 0
    assert "store" in sources  # the conversations it still held came back from it


def test_a_feature_draft_reuses_no_prompt_and_says_why(distilled: dict[str, Any]) -> None:
    """A feature draft needs the target's features of every prompt position, which a kept
    prefix does not recompute: its generations read the prompt whole and the stats say why;
    a lookup on the same artifact keeps the prefix."""
    warm_pipe = Pipeline.load(distilled["artifact"])
    cold_pipe = Pipeline.load(distilled["artifact"], prefix=COLD)
    options = {"max_new_tokens": 10, "k": 3, "drafter": "eagle"}
    warm = conversation(lambda p: warm_pipe.generate(p, **options))
    cold = conversation(lambda p: cold_pipe.generate(p, **options))
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    for result in warm[1:]:
        assert result.stats.reused_prompt_tokens == 0
        assert "feature draft" in result.stats.prompt_cache_note
    lookups = conversation(lambda p: warm_pipe.generate(p, max_new_tokens=10, k=3, drafter="ngram"))
    assert lookups[2].stats.reused_prompt_tokens == expected_reuse(lookups, 2)


def test_a_grammar_s_generation_keeps_its_prompt_as_any_other(llama_pair: TinyPair) -> None:
    from specx.runtime import Grammar

    grammar = Grammar.json_object()
    warm_pipe = Pipeline.load(llama_pair.artifact)
    cold_pipe = Pipeline.load(llama_pair.artifact, prefix=COLD)
    options = {"max_new_tokens": 12, "k": 3, "drafter": "mixed", "grammar": grammar}
    warm = conversation(lambda p: warm_pipe.generate(p, **options))
    cold = conversation(lambda p: cold_pipe.generate(p, **options))
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    # (one more where the answer's end token was an accepted draft: the cache computed it too)
    assert warm[2].stats.reused_prompt_tokens >= expected_reuse(warm, 2)

"""Property-based tests (hypothesis) of the verifier and of the cache bookkeeping.

A scripted drafter proposes, at every step, a random number of tokens of which a random prefix is
the target's true greedy continuation and the rest is wrong. Whatever the pattern of acceptances,
rejections and K, the committed tokens must equal the target's own greedy output (computed once
without speculation), and after every step the caches must hold exactly the committed tokens but
the last one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TinyPair, needs_exporter
from specx.runtime import GenerationSettings
from specx.runtime.artifact.contract import Manifest
from specx.runtime.backends import OrtSession
from specx.runtime.decode.loop import decode_loop
from specx.runtime.decode.policy import FixedK
from specx.runtime.decode.sequence import Sequence
from specx.runtime.decode.stats import Stats
from specx.runtime.drafters import DraftRequest, Proposal
from specx.runtime.verification.verify import verify_greedy


@given(
    draft=st.lists(st.integers(0, 7), min_size=0, max_size=6),
    seed=st.integers(0, 2**31 - 1),
)
def test_verify_greedy_accepts_exactly_the_matching_prefix(draft: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(draft) + 1, 8))  # [k + 1, vocab]
    choice = np.argmax(logits, axis=-1)
    n, nxt = verify_greedy(np.asarray(draft, dtype=np.int64), logits)
    expected = 0
    while expected < len(draft) and draft[expected] == choice[expected]:
        expected += 1
    assert n == expected and nxt == choice[n]


class ScriptedDrafter:
    """Proposes `k_i` tokens per step: `good_i` right ones (from the reference), then wrong ones."""

    name = "scripted"

    def __init__(self, reference: list[int], prompt_len: int, plan: list[tuple[int, int]]) -> None:
        self.reference = reference
        self.prompt_len = prompt_len
        self.plan = plan
        self.step = 0
        self.checks: list[int] = []

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        self.step = 0

    def source(self, context: np.ndarray) -> str:
        return "script"

    def propose(self, context: np.ndarray, k: int, plan: Any = None) -> Proposal:
        produced = len(context) - self.prompt_len
        want_k, good = self.plan[self.step % len(self.plan)]
        self.step += 1
        k = min(k, want_k)
        truth = self.reference[produced : produced + k]
        tokens = [t if i < good else (t + 1) % 300 for i, t in enumerate(truth)]
        return Proposal(np.asarray(tokens, dtype=np.int64))

    def commit(self, num_accepted: int) -> None:
        self.checks.append(num_accepted)


@needs_exporter
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=12))
def test_any_acceptance_pattern_keeps_the_cache_and_output_exact(
    llama_pair: TinyPair, plan: list[tuple[int, int]]
) -> None:
    manifest = Manifest.read(llama_pair.artifact)
    session = _session(llama_pair)
    prompt = np.array([12, 40, 77, 5, 9], dtype=np.int64)
    reference = _reference(llama_pair, prompt)
    drafter = ScriptedDrafter(reference, len(prompt), plan)
    cache = session.new_cache(manifest.max_length)
    committed: list[int] = []
    stats = Stats()
    eos = frozenset(manifest.special_tokens.eos_token_ids)
    settings = GenerationSettings(max_new_tokens=40)
    seq = Sequence(prompt, settings, FixedK(8), drafter, stats, session.vocab_size, eos)
    for tokens in decode_loop(session, cache, seq):
        committed += tokens.tolist()
        # invariant: the target cache holds every committed token but the last one
        assert cache.length == len(prompt) + len(committed) - 1
    assert committed == reference[: len(committed)]
    assert len(committed) == 40 or stats.stop_reason == "eos"
    assert stats.accepted <= stats.proposed
    # the passes by width count every pass once and every proposed token once
    assert sum(stats.pass_widths.values()) == stats.target_passes
    assert sum((w - 1) * n for w, n in stats.pass_widths.items()) == stats.proposed


_cache: dict[str, Any] = {}


def _session(pair: TinyPair) -> OrtSession:
    key = f"session:{pair.artifact}"
    if key not in _cache:
        manifest = Manifest.read(pair.artifact)
        _cache[key] = OrtSession(pair.artifact / "target.onnx", manifest.target)
    return _cache[key]  # type: ignore[no-any-return]


def _reference(pair: TinyPair, prompt: np.ndarray) -> list[int]:
    key = f"reference:{pair.artifact}"
    if key not in _cache:
        from specx.runtime import Pipeline

        _cache[key] = (
            Pipeline.load(pair.artifact).generate(prompt, max_new_tokens=40, k=0).token_ids
        )
    return _cache[key]  # type: ignore[no-any-return]

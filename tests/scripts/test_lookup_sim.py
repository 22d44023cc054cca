"""scripts/diagnostics/lookup_sim.py: -k auto over lookups replayed on a recorded greedy text."""

from __future__ import annotations

import numpy as np

from conftest import load_script
from specx.runtime.decode.adaptive import AdaptiveK


def test_the_lookup_replay_drafts_where_the_text_repeats_and_not_where_it_does_not() -> None:
    sim = load_script("lookup_sim")
    prompt = np.arange(100, 160, dtype=np.int64)  # 60 distinct tokens
    pass_s = {w: 0.02 * (1 + 0.05 * (w - 1)) for w in range(1, 10)}  # cheap extra rows
    rng = np.random.default_rng(0)
    repeated = prompt[:40].tolist()  # the answer copies the prompt: lookups carry it
    novel = list(range(1000, 1040))  # nothing to look up

    def rate(text: list[int], policy: AdaptiveK | None, k: int) -> tuple[float, float]:
        tokens, seconds = sim.replay(
            prompt, text, sim.make_drafter("ngram", (2,)), pass_s, policy, k, rng
        )
        assert tokens == len(text)
        return tokens / seconds, seconds

    alone, _ = rate(repeated, None, 0)
    fixed, _ = rate(repeated, None, 4)
    auto, _ = rate(repeated, AdaptiveK(max_k=8), 0)
    assert fixed > 2 * alone and auto > 2 * alone  # a copied answer: several tokens a pass
    # the negative control: a text that repeats nothing gains nothing, and auto loses nothing
    alone_novel, _ = rate(novel, None, 0)
    auto_novel, _ = rate(novel, AdaptiveK(max_k=8), 0)
    assert auto_novel >= 0.95 * alone_novel
    assert auto_novel < 1.1 * alone_novel

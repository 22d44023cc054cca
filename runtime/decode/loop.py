"""One sequence alone: prefill, then speculative steps until it stops.

A step is propose, verify, accept, commit (sequence.py holds the sequence's half of each): the
drafter proposes up to K tokens, the target verifies ``[last_committed, d_1 .. d_k]`` in one pass
that also extends its cache, and the sequence accepts on those logits and commits. With no
drafter (K = 0) the same step is plain one-token decoding: the baseline. A batch runs the same
steps for many sequences at once (batch/decoder.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from time import perf_counter

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.sequence import Sequence
from specx.runtime.drafters.base import FeatureReader
from specx.runtime.kv_cache import KVCache


def speculative_step(target: GraphSession, cache: KVCache, seq: Sequence) -> np.ndarray:
    """One round: the drafter proposes up to K tokens, the target verifies them in one pass (under
    the grammar's masks when there is one), the sequence accepts and commits. Returns the tokens
    the step emits."""
    seq.find_source()
    seq.decide(room=cache.capacity - cache.length - 1)
    seq.propose()
    seq.admit()
    committed = cache.length
    t0 = perf_counter()
    logits = target.forward(seq.verify_input(), cache)  # [n + 1, vocab]
    return seq.commit(logits, cache, committed, perf_counter() - t0, target.last_features)


# (the cache, the sequence) -> None: keep the longest prefix of the sequence's prompt the cache
# holds (or bring one back), setting the cache's length to it (runtime/prefix)
Resume = Callable[[KVCache, Sequence], None]


def decode_loop(
    target: GraphSession, cache: KVCache, seq: Sequence, resume: Resume | None = None
) -> Iterator[np.ndarray]:
    """Prefill what the cache lacks of the prompt, then yield the tokens each step emits until
    the sequence stops. resume: keeps a prefix of the prompt the cache holds (None: the cache
    starts empty).

    The caller checks the prompt length (1..cache capacity). The sequence's stats are updated as
    it goes, so they are complete even if the consumer stops early; so are its logprobs."""
    stats = seq.stats
    t0 = perf_counter()
    if resume is None:
        cache.reset()
    else:
        resume(cache, seq)
    seq.start(cache.capacity, prefill=not isinstance(seq.policy, AdaptiveK))
    prompt = seq.committed
    if prompt.shape[0] - 1 > cache.length:
        reader = seq.drafter.observe_features if isinstance(seq.drafter, FeatureReader) else None
        read = prompt[cache.length : -1]
        t1 = perf_counter()
        target.prefill(read, cache, reader)
        if isinstance(seq.policy, AdaptiveK):  # what a row costs, before any verify pass says
            seq.policy.observe_prefill(int(read.shape[0]), perf_counter() - t1)
    stats.prefill_s = perf_counter() - t0
    seq.decode_start = perf_counter()
    try:
        while not seq.done:
            yield speculative_step(target, cache, seq)
    finally:
        stats.decode_s = perf_counter() - seq.decode_start

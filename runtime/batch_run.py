"""Pipeline.generate_batch: a list of prompts through one BatchDecoder (runtime/batching.py),
`max_batch` rows at a time, each row's result what `generate` gives that prompt alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from specx.runtime.adaptive import AdaptiveK
from specx.runtime.backends.ort_session import OrtSession
from specx.runtime.batching import BatchDecoder, BatchSequence, single_graph
from specx.runtime.drafters.base import Drafter
from specx.runtime.errors import InputError
from specx.runtime.settings import GenerationSettings
from specx.runtime.stats import Stats

if TYPE_CHECKING:
    from specx.runtime.pipeline import GenerationResult, Pipeline, Prompt


def batch_capacity(needs: list[int], max_k: int, limit: int) -> int:
    """Positions per row: the longest sequence (prompt + new tokens) plus room for a full
    verify pass, rounded up to 64, at most `limit`. Attention reads every slot of a row, so the
    rows are sized to the work, not to the artifact's whole context."""
    want = max(needs) + max_k + 2
    return min(limit, -(-want // 64) * 64)


def run_batch(
    pipeline: Pipeline,
    prompts: Sequence[Prompt],
    settings: list[GenerationSettings],
    max_batch: int,
    on_tokens: Callable[[int, np.ndarray], None] | None = None,
) -> list[GenerationResult]:
    """Pipeline.generate_batch: every prompt through one BatchDecoder, `max_batch` at a time."""
    from specx.runtime.pipeline import GenerationResult, policy_memory

    if not 1 <= max_batch <= 256:
        raise InputError(f"max_batch must be in 1..256, got {max_batch}")
    session = pipeline.batched_session()
    assert isinstance(session, OrtSession)
    plans = [pipeline.resolve_policy(s, batched=True) for s in settings]
    ids = [
        pipeline.encode_prompt(p, s.chat, s.system) for p, s in zip(prompts, settings, strict=True)
    ]
    constraints = [None if s.grammar is None else pipeline.constraint(s.grammar) for s in settings]
    results = [
        GenerationResult(
            "",
            [],
            x.tolist(),
            Stats(k=k, drafter=name, adaptive=isinstance(policy, AdaptiveK)),
            logprobs=None if s.logprobs is None else [],
        )
        for x, (policy, k, name), s in zip(ids, plans, settings, strict=True)
    ]
    if not prompts:
        return results
    limit = pipeline.manifest.batched.max_length if pipeline.manifest.batched else 0
    needs = [int(x.shape[0]) + s.max_new_tokens for x, s in zip(ids, settings, strict=True)]
    max_k = max(k for _, k, _ in plans)
    capacity = batch_capacity(needs, max_k, min(limit, pipeline.manifest.max_length))
    decoder = BatchDecoder(
        session.fork(),
        min(max_batch, len(prompts)),
        capacity,
        pipeline.manifest.special_tokens.eos_token_ids,
        single_graph(pipeline),
        pipeline.batch_pass_costs,
    )
    running: dict[int, tuple[BatchSequence, str, Drafter | None]] = {}
    waiting = list(range(len(prompts)))
    try:
        while waiting or decoder.busy:
            while waiting and decoder.free_rows:
                i = waiting.pop(0)
                policy, _, name = plans[i]
                emit = (lambda t, i=i: on_tokens(i, t)) if on_tokens is not None else None
                drafter = pipeline.take_drafter(name)  # back to the pool once its row is done
                running[i] = (
                    decoder.add(
                        ids[i],
                        settings[i],
                        policy,
                        drafter,
                        results[i].stats,
                        emit,
                        constraints[i],
                        results[i].logprobs,
                    ),
                    name,
                    drafter,
                )
            decoder.finish_together = not waiting  # the caller gets every result at once
            decoder.step()
            for i, (seq, name, drafter) in list(running.items()):
                if seq.done:
                    del running[i]
                    pipeline.give_drafter(name, drafter)
                    pipeline.remember_policy(policy_memory(name, True), seq.policy)
                    results[i].token_ids = seq.tokens
                    results[i].text = pipeline.codec.decode(seq.tokens)
                    results[i].finished = True
    finally:
        for seq, name, drafter in running.values():  # an error stopped the batch
            decoder.cancel(seq)
            pipeline.give_drafter(name, drafter)
    return results

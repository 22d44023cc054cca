"""Pipeline.generate_batch: a list of prompts through one BatchDecoder (decoder.py),
`max_batch` rows at a time, each row's result what `generate` gives that prompt alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specx.runtime.batch.decoder import BatchDecoder
from specx.runtime.batch.rows import RowQueue
from specx.runtime.decode import sequence
from specx.runtime.errors import InputError
from specx.runtime.settings import GenerationSettings

if TYPE_CHECKING:
    from specx.runtime.pipeline import Pipeline, Prompt
    from specx.runtime.result import GenerationResult


def batch_capacity(needs: list[int], max_k: int, limit: int) -> int:
    """Positions per row: the longest sequence (prompt + new tokens) plus room for a full
    verify pass, rounded up to 64, at most `limit`. Attention reads every slot of a row, so the
    rows are sized to the work, not to the artifact's whole context."""
    want = max(needs) + max_k + 2
    return min(limit, -(-want // 64) * 64)


@dataclass(eq=False)
class _Prompt:
    """One prompt's generation as a job of the batch (rows.Job)."""

    seq: sequence.Sequence
    result: GenerationResult
    drafter_name: str
    pipeline: Pipeline
    error: BaseException | None = None

    def admitted(self) -> None:
        self.seq.drafter = self.pipeline.take_drafter(self.drafter_name)

    def cancelled(self) -> bool:
        return False

    def end(self, error: BaseException | None = None) -> None:
        if self.seq.drafter is not None:
            self.pipeline.give_drafter(self.drafter_name, self.seq.drafter)
            self.seq.drafter = None
        self.error = error
        if error is None:
            self.pipeline.remember_policy(self.drafter_name, self.seq.policy, batched=True)
            self.result.token_ids = self.seq.tokens
            self.result.text = self.pipeline.codec.decode(self.seq.tokens)
            self.result.finished = True


def run_batch(
    pipeline: Pipeline,
    prompts: Sequence[Prompt],
    settings: list[GenerationSettings],
    max_batch: int,
    on_tokens: Callable[[int, np.ndarray], None] | None = None,
) -> list[GenerationResult]:
    """Pipeline.generate_batch: every prompt through one BatchDecoder, `max_batch` at a time."""
    if not 1 <= max_batch <= 256:
        raise InputError(f"max_batch must be in 1..256, got {max_batch}")
    session = pipeline.batched_session()
    jobs = []
    for i, (prompt, setting) in enumerate(zip(prompts, settings, strict=True)):
        emit = (lambda t, i=i: on_tokens(i, t)) if on_tokens is not None else None
        ids, constraint = pipeline.prepare(prompt, setting)
        seq, result, name = pipeline.new_sequence(ids, setting, constraint, True, emit)
        jobs.append(_Prompt(seq, result, name, pipeline))
    if not jobs:
        return []
    limit = pipeline.manifest.batched.max_length if pipeline.manifest.batched else 0
    needs = [job.seq.n_context + job.seq.settings.max_new_tokens for job in jobs]
    max_k = max(job.result.stats.k for job in jobs)
    capacity = batch_capacity(needs, max_k, min(limit, pipeline.manifest.max_length))
    decoder = BatchDecoder(
        session.fork(),
        min(max_batch, len(jobs)),
        capacity,
        pipeline.single_graph(),
        pipeline.batch_pass_costs,
        pipeline.prefixes,
    )
    rows = RowQueue(decoder, caller_waits_for_all=True)
    for job in jobs:
        rows.put(job)
    try:
        while rows.busy:
            rows.cycle()
            failed = [job.error for job in jobs if job.error is not None]
            if failed:  # a prompt no row can take
                raise failed[0]
    except BaseException as e:  # the batch stops: every drafter goes back to the pool
        rows.fail_running(e)
        raise
    decoder.keep_prefixes()  # the decoder goes: what its rows hold goes to the store
    return [job.result for job in jobs]

"""Batched speculative decoding: several sequences in one target pass (runtime/batch/decoder.py).

Each sequence of a batch must decode exactly as it would alone: greedy output equal to
transformers' own greedy output (up to float near-ties, tests/reference.py), seeded sampling equal
to the same seed alone, whatever else shares the batch, with rows joining and leaving as they
start and stop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batch_tools import PROMPTS, pipe_settings, prompt_ids, row_sequence
from conftest import needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import Pipeline
from specx.runtime.errors import InputError

pytestmark = needs_exporter


@pytest.mark.parametrize(
    ("drafter", "k"),
    [("none", 0), ("ngram", 3), ("mixed", 3), ("mixed", "auto"), ("ngram+mixed", "auto")],
)
def test_every_sequence_of_a_batch_decodes_as_transformers_greedy(
    batched_llama: Any, drafter: str, k: Any
) -> None:
    artifact, target = batched_llama
    pipe = Pipeline.load(artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    lengths = [20, 7, 30, 12, 25]  # rows stop at different steps; later prompts join
    settings = [pipe_settings(max_new_tokens=n, drafter=drafter, k=k) for n in lengths]
    results = pipe.generate_batch(PROMPTS, settings, max_batch=3)
    for prompt, n, result in zip(PROMPTS, lengths, results, strict=True):
        ids = prompt_ids(pipe, prompt)
        want = hf_greedy(target, ids, n, eos)
        assert_same_or_near_tie(target, ids, result.token_ids, want)
        assert result.finished and result.stats.new_tokens == len(result.token_ids)
        assert result.text == pipe.codec.decode(result.token_ids)


def test_a_seeded_sample_in_a_batch_is_the_same_text_as_alone(batched_llama: Any) -> None:
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    options = {"max_new_tokens": 24, "temperature": 3.0, "drafter": "mixed", "k": 3}
    alone = [pipe.generate(p, seed=11 + i, **options).token_ids for i, p in enumerate(PROMPTS)]
    mates = [pipe_settings(seed=11 + i, **options) for i in range(len(PROMPTS))]
    together = pipe.generate_batch(PROMPTS, mates, max_batch=4)
    assert [r.token_ids for r in together] == alone
    # other batch mates (other seeds, other order) leave each sequence's text unchanged
    shuffled = pipe.generate_batch(PROMPTS[::-1], mates[::-1], max_batch=2)
    assert [r.token_ids for r in shuffled][::-1] == alone
    assert len({tuple(t) for t in alone}) == len(alone)


def test_rows_join_and_leave_and_several_share_each_pass(batched_llama: Any) -> None:
    from specx.runtime.batch.decoder import BatchDecoder

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    session = pipe.batched_session()
    decoder = BatchDecoder(session.fork(), 2, 96)
    emitted: dict[int, list[int]] = {0: [], 1: [], 2: []}
    seqs = {}
    for i, n in ((0, 5), (1, 12)):
        settings = pipe_settings(max_new_tokens=n)
        ids = prompt_ids(pipe, PROMPTS[i])
        seqs[i] = decoder.add(row_sequence(pipe, ids, settings, emit=emitted[i].extend))
    assert decoder.free_rows == 0
    with pytest.raises(InputError, match="busy"):
        decoder.add(row_sequence(pipe, prompt_ids(pipe, PROMPTS[2]), pipe_settings()))
    while not seqs[0].done:
        decoder.step()
    assert decoder.free_rows == 1 and not seqs[1].done  # row 0 left, row 1 goes on
    settings = pipe_settings(max_new_tokens=4)
    seqs[2] = decoder.add(
        row_sequence(pipe, prompt_ids(pipe, PROMPTS[2]), settings, emit=emitted[2].extend)
    )
    decoder.run()
    assert max(decoder.rows_per_pass) == 2
    for i, n in ((0, 5), (1, 12), (2, 4)):
        assert emitted[i] == seqs[i].tokens and len(seqs[i].tokens) == n
        assert seqs[i].stats.stop_reason == "max_new_tokens"
        alone = pipe.generate(PROMPTS[i], max_new_tokens=n, k=0).token_ids
        assert seqs[i].tokens == alone
    # finished rows are free and keep what they computed for a later prompt of their scope
    assert decoder.free_rows == 2 and not decoder.busy
    for s in (seqs[1], seqs[2]):  # the last sequences of the two rows
        held = decoder.cache.held(s.row)
        assert held.tolist() == s.committed[: held.shape[0]].tolist()


def test_batching_refuses_what_it_cannot_do_with_a_clear_error(
    batched_llama: Any, tmp_path: Path
) -> None:
    import json
    import shutil

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    with pytest.raises(InputError, match="max_batch"):
        pipe.generate_batch(PROMPTS[:1], max_batch=0)
    with pytest.raises(InputError, match="2 settings for 1 prompts"):
        pipe.generate_batch(PROMPTS[:1], [pipe_settings(), pipe_settings()])
    with pytest.raises(InputError, match="unknown drafter"):
        pipe.generate_batch(PROMPTS[:1], drafter="nope")
    single = tmp_path / "single"
    shutil.copytree(artifact, single, ignore=shutil.ignore_patterns("target.batched.onnx"))
    data = json.loads((single / "manifest.json").read_text())
    del data["batched"]
    (single / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"no batched graph.*--batched"):
        Pipeline.load(single).generate_batch(PROMPTS[:1])
    assert pipe.generate_batch([]) == []


def test_a_batch_plans_for_its_last_row_only_once_no_prompt_waits_for_a_row(
    batched_llama: Any, monkeypatch: Any
) -> None:
    """generate_batch's caller gets every result at once: once no prompt waits for a free row,
    -k auto is told the most tokens any row has left (the rows that finish the batch); while
    prompts wait, and for the threads of a batching pipeline, nothing (each row counts)."""
    from specx.runtime.batch.widths import WidthPlanner

    told: list[int | None] = []
    plan = WidthPlanner.plan

    def recorded(self: Any, active: Any, rows: int, joining: int = 0, last: Any = None) -> Any:
        told.append(last)
        return plan(self, active, rows, joining, last)

    monkeypatch.setattr(WidthPlanner, "plan", recorded)
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    options = {"max_new_tokens": 10, "drafter": "ngram", "k": "auto"}
    alone = [pipe.generate(p, **options).token_ids for p in PROMPTS[:3]]
    told.clear()
    results = pipe.generate_batch(PROMPTS[:3], [pipe_settings(**options)] * 3, max_batch=2)
    assert [r.token_ids for r in results] == alone
    waited = told.index(next(t for t in told if t is not None))
    assert waited > 0 and all(t is None for t in told[:waited])  # the third prompt waited
    assert all(t is not None and 1 <= t <= 10 for t in told[waited:])
    assert told[waited:] == sorted(told[waited:], reverse=True)  # the last rows' tokens left
    told.clear()
    pipe.enable_batching(max_batch=2, context=96)
    try:
        assert pipe.generate(PROMPTS[0], **options).token_ids == alone[0]
    finally:
        pipe.disable_batching()
    assert told and all(t is None for t in told)


def test_threads_sharing_a_batching_pipeline_get_their_solo_outputs(batched_llama: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    jobs = [
        {"max_new_tokens": 12 + 3 * i, "drafter": d, "k": k}
        for i, (d, k) in enumerate([("mixed", 3), ("ngram", 2), ("none", 0), ("mixed", "auto")])
    ]
    jobs.append({"max_new_tokens": 20, "temperature": 2.0, "seed": 5, "drafter": "mixed", "k": 2})
    alone = [pipe.generate(p, **j).token_ids for p, j in zip(PROMPTS, jobs, strict=True)]
    long_alone = pipe.generate(PROMPTS[4], max_new_tokens=60, k=0).token_ids
    pipe.enable_batching(max_batch=3, context=96)
    try:
        with ThreadPoolExecutor(5) as pool:
            together = list(
                pool.map(lambda pj: pipe.generate(pj[0], **pj[1]), zip(PROMPTS, jobs, strict=True))
            )
        assert [r.token_ids for r in together] == alone
        assert max(pipe.batching.decoder.rows_per_pass) > 1  # they did share passes
        # a stream closed early frees its row; the next generations still run
        generation = pipe.stream(PROMPTS[0], max_new_tokens=40, k=0)
        next(iter(generation))
        generation.close()
        assert generation.result.stats.stop_reason == "interrupted"
        assert pipe.generate(PROMPTS[1], **jobs[1]).token_ids == alone[1]
        # too long for a batch row: runs alone, exactly as before
        passes = pipe.batching.decoder.passes
        assert pipe.generate(PROMPTS[4], max_new_tokens=60, k=0).token_ids == long_alone
        assert pipe.batching.decoder.passes == passes
    finally:
        pipe.disable_batching()
    assert pipe.batching is None


def test_the_gqa_graph_takes_one_token_per_row_over_rows_of_different_lengths(
    batched_llama: Any,
) -> None:
    """The passes a batch routes to the single-sequence graph give the batched graph's logits."""
    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    batched, single = pipe.batched_session().fork(), pipe.target.fork()
    rng = np.random.default_rng(3)
    caches = [batched.new_batch_cache(3, 64) for _ in range(2)]
    for row, n in enumerate((9, 4, 13)):  # the same prompts into both caches, one by each graph
        prompt = rng.integers(0, 300, n)[None]
        for cache, session in zip(caches, (batched, single), strict=True):
            session.forward_rows(prompt, np.array([n]), cache, first_row=row)
    step = rng.integers(0, 300, (3, 1))
    got_b = batched.forward_rows(step, np.ones(3, dtype=np.int64), caches[0]).copy()
    got_s = single.forward_rows(step, np.ones(3, dtype=np.int64), caches[1]).copy()
    assert np.max(np.abs(got_b - got_s)) < 1e-4
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [10, 5, 14]
    with pytest.raises(InputError, match="batched graph"):
        single.forward_rows(rng.integers(0, 300, (3, 2)), np.full(3, 2), caches[1])


SAMPLES = 2000


SMALL_PROMPT = np.array([0, 5, 9, 4], dtype=np.int64)


@pytest.fixture(scope="module")
def small_batched(tmp_path_factory: Any) -> Any:
    """Target and a related draft over 12 tokens, flat enough to sample, with a batched graph."""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("smallbatched")
    tok = tiny_models.build_small_vocab_tokenizer()
    target = tiny_models.build_model("llama", tok.get_vocab_size(), seed=11, init_range=0.06)
    draft = tiny_models.perturbed_copy(target, 0.6, seed=12)
    src = tiny_models.save(target, tok, root / "target")
    dsrc = tiny_models.save(draft, tok, root / "draft")
    artifact = root / "artifact"
    options = ExportOptions(max_length=64, batched=True)
    export_pair(str(src), [f"draft={dsrc}"], artifact, options, log=lambda _m: None)
    return artifact, target


def first_two_distribution(model: Any, params: Any, eos: int) -> dict[tuple[int, int], float]:
    """P(first two generated tokens) under the target alone, from the source model."""
    import torch

    from specx.runtime.verification.sampling import warp

    with torch.no_grad():
        first = model(torch.from_numpy(SMALL_PROMPT)[None]).logits[0, -1].numpy()
        vocab = first.shape[0]
        follow = np.concatenate(
            [np.stack([SMALL_PROMPT] * vocab), np.arange(vocab)[:, None]], axis=1
        )  # [vocab, len + 1]
        second = model(torch.from_numpy(follow)).logits[:, -1].numpy()  # [vocab, vocab]
    p1, p2 = warp(first, params), warp(second, params)
    return {
        (a, b): float(p1[a] * (1.0 if a == eos else p2[a, b]))
        for a in range(vocab)
        for b in ([-1] if a == eos else range(vocab))
    }


def batched_pairs(artifact: Any, params: Any, eos: int) -> list[tuple[int, int]]:
    """The first two tokens of SAMPLES seeds, 8 sequences per pass, K=4 with the draft."""
    import dataclasses

    pipe = Pipeline.load(artifact)
    settings = [pipe_settings(max_new_tokens=4, k=4, drafter="draft") for _ in range(SAMPLES)]
    settings = [
        dataclasses.replace(s, sampling=dataclasses.replace(params, seed=i))
        for i, s in enumerate(settings)
    ]
    results = pipe.generate_batch([SMALL_PROMPT] * SAMPLES, settings, max_batch=8)
    return [(r.token_ids[0], -1 if r.token_ids[0] == eos else r.token_ids[1]) for r in results]


@pytest.mark.parametrize("verification", ["invariant", "rejection"])
def test_sampling_in_a_batch_follows_the_targets_distribution(
    small_batched: Any, verification: str
) -> None:
    from specx.runtime import SamplingParams
    from stats_tools import chi_square_p_value

    artifact, target = small_batched
    params = SamplingParams(temperature=1.0, verification=verification)
    eos = Pipeline.load(artifact).manifest.special_tokens.eos_token_ids[0]
    expected = first_two_distribution(target, params, eos)
    assert sum(1 for p in expected.values() if p * SAMPLES >= 5) >= 10  # a meaningful test
    assert chi_square_p_value(batched_pairs(artifact, params, eos), expected) > 1e-3


def test_the_batched_chi_square_catches_a_broken_verifier(
    small_batched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: a verifier that accepts every draft token fails the same test."""
    import specx.runtime.verification.verifier as generate
    from specx.runtime import SamplingParams
    from stats_tools import accept_everything_invariant, chi_square_p_value

    monkeypatch.setattr(generate, "verify_invariant", accept_everything_invariant)
    artifact, target = small_batched
    params = SamplingParams(temperature=1.0)
    eos = Pipeline.load(artifact).manifest.special_tokens.eos_token_ids[0]
    expected = first_two_distribution(target, params, eos)
    assert chi_square_p_value(batched_pairs(artifact, params, eos), expected) < 1e-6


def test_a_long_prompt_joins_in_chunks_while_the_others_decode(batched_llama: Any) -> None:
    from specx.runtime.batch.decoder import BatchDecoder

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    decoder = BatchDecoder(pipe.batched_session().fork(), 2, 128, pipe.single_graph())
    short = decoder.add(
        row_sequence(pipe, prompt_ids(pipe, PROMPTS[1]), pipe_settings(max_new_tokens=20))
    )
    decoder.step()
    long_prompt = np.concatenate([prompt_ids(pipe, p) for p in PROMPTS])[:100]
    long = decoder.add(row_sequence(pipe, long_prompt, pipe_settings(max_new_tokens=8)))
    before = len(short.tokens)
    decoder.step()  # the first 64 prompt tokens of the long row, and a decode step of the short
    assert len(short.tokens) == before + 1 and long.prefilled == decoder.prompts.PREFILL_CHUNK
    assert decoder.active == [short]
    decoder.run()
    assert short.tokens == pipe.generate(PROMPTS[1], max_new_tokens=20, k=0).token_ids
    assert long.tokens == pipe.generate(long_prompt, max_new_tokens=8, k=0).token_ids
    assert long.stats.prefill_s > 0 and long.stats.stop_reason == "max_new_tokens"


def test_rows_drafting_together_propose_what_each_would_alone_in_fewer_passes(
    batched_llama: Any,
) -> None:
    """Shared draft passes (drafters/shared_passes.py): four rows at different lengths, row 0
    reading its prompt and row 3 four tokens behind (alone, then they join), rows 1 and 2 two
    tokens behind (a shared catch-up pass), propose exactly the tokens their drafters propose
    alone, with one pass per round for all rows instead of one per row."""
    from specx.runtime.drafters.base import DraftRequest
    from specx.runtime.drafters.model import ModelDrafter
    from specx.runtime.drafters.shared_passes import DraftRows, RowSteps
    from specx.runtime.verification.sampling import PositionNoise, SamplingParams

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    contexts = [prompt_ids(pipe, p) for p in PROMPTS[:4]]
    behind = [len(contexts[0]), 2, 2, 4]  # committed tokens each row's cache lacks
    vocab = pipe.manifest.target.vocab_size
    request = DraftRequest(SamplingParams(), PositionNoise(0, vocab), prefill=False)

    def drafter() -> ModelDrafter:
        made = pipe.new_drafter("mixed")
        assert isinstance(made, ModelDrafter)
        return made

    alone = [drafter() for _ in contexts]
    shared = [drafter() for _ in contexts]
    rows = DraftRows(shared[0].session.fork(), 4, 96)
    for row, (a, d, context) in enumerate(zip(alone, shared, contexts, strict=True)):
        d.bind_row(rows, row)
        for each in (a, d):
            each.start(context, request)
            if row > 0:
                each.propose(context[: -behind[row]], 3)
                each.commit(0)
    assert [rows.length(r) for r in range(4)] == [
        len(c) - n for c, n in zip(contexts, behind, strict=True)
    ]
    want = [a.propose(c, 3).tokens.tolist() for a, c in zip(alone, contexts, strict=True)]
    before = rows.passes
    jobs = [
        RowSteps(r, d.proposal_steps(c, 3))
        for r, (d, c) in enumerate(zip(shared, contexts, strict=True))
    ]
    got = rows.propose(jobs)
    assert [got[row].tokens.tolist() for row in range(4)] == want
    assert all(len(w) == 3 for w in want)
    # one catch-up pass for rows 1 and 2; rows 0 and 3 read alone and then draft one round
    # ahead of them: three rounds more
    assert rows.passes - before == 4
    assert rows.caught_up == len(contexts[0]) - 1 + 3  # tokens read alone: row 0's and row 3's
    assert [rows.length(r) for r in range(4)] == [len(c) + 2 for c in contexts]
    for d, a in zip(shared, alone, strict=True):
        d.commit(1)
        a.commit(1)
    assert [rows.length(r) for r in range(4)] == [len(c) + 1 for c in contexts]


def test_a_batch_shares_its_draft_models_passes_and_unbinds_its_drafters(
    batched_llama: Any,
) -> None:
    """Rows drafting with the same draft model share its passes; each decodes as alone, and
    once done its drafter works alone again (its own cache)."""
    from specx.runtime.batch.decoder import BatchDecoder
    from specx.runtime.decode.policy import FixedK

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    decoder = BatchDecoder(pipe.batched_session().fork(), 3, 96)
    drafters = [pipe.new_drafter("mixed") for _ in range(3)]
    settings = pipe_settings(max_new_tokens=20)
    seqs = [
        decoder.add(row_sequence(pipe, prompt_ids(pipe, PROMPTS[i]), settings, FixedK(3), d))
        for i, d in enumerate(drafters)
    ]
    decoder.run()
    (rows,) = decoder.draft_rows
    row_passes = sum(s.stats.draft_passes for s in seqs)
    assert 0 < rows.passes < row_passes  # shared: fewer passes than the rows took part in
    for i, s in enumerate(seqs):
        alone = pipe.generate(PROMPTS[i], max_new_tokens=20, k=3, drafter="mixed")
        assert s.tokens == alone.token_ids
        assert s.draft_rows is None
    # back on its own cache: the drafter proposes alone as a fresh one does
    from specx.runtime.drafters.base import DraftRequest
    from specx.runtime.verification.sampling import PositionNoise, SamplingParams

    request = DraftRequest(SamplingParams(), PositionNoise(0, pipe.manifest.target.vocab_size))
    fresh = pipe.new_drafter("mixed")
    ids = prompt_ids(pipe, PROMPTS[3])
    for d in (drafters[0], fresh):
        d.start(ids, request)
    assert drafters[0].propose(ids, 3).tokens.tolist() == fresh.propose(ids, 3).tokens.tolist()
    for s in seqs:  # the draft rows keep a prefix of what their sequences committed
        held = rows.cache.held(s.row)
        assert held.shape[0] > 0 and held.tolist() == s.committed[: held.shape[0]].tolist()


def test_rows_sharing_a_prompt_prefix_copy_it_and_decode_as_alone(batched_llama: Any) -> None:
    """A joining row copies the prompt prefix another row holds (a shared system prompt) into
    its target row and its draft row instead of computing it; every row still decodes exactly
    as alone, and the copy is counted in its statistics."""
    artifact, target = batched_llama
    pipe = Pipeline.load(artifact)
    system = "You are a careful assistant. "
    prompts = [system + p for p in PROMPTS[:3]]
    shared = len(pipe.encode_prompt(system)) - 2  # tokens at the seam may merge
    results = pipe.generate_batch(
        prompts, pipe_settings(max_new_tokens=12, k=3, drafter="mixed"), max_batch=3
    )
    reused = [r.stats.reused_prompt_tokens for r in results]
    assert reused[0] == 0 and min(reused[1:]) >= shared > 8
    for prompt, result in zip(prompts, results, strict=True):
        ids = pipe.encode_prompt(prompt)
        eos = pipe.manifest.special_tokens.eos_token_ids
        assert_same_or_near_tie(target, ids, result.token_ids, hf_greedy(target, ids, 12, eos))


def test_rows_joining_together_read_their_prompts_in_one_pass_after_a_shared_prefix(
    batched_llama: Any,
) -> None:
    """Rows that join in the same step read their prompts in one batched pass; rows sharing a
    system prompt let the first compute it alone, then copy it and read the rest together."""
    from specx.runtime.batch.decoder import BatchDecoder

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)

    def decoder_with(prompts: list[str]) -> tuple[BatchDecoder, list[Any]]:
        decoder = BatchDecoder(pipe.batched_session().fork(), 3, 128, pipe.single_graph())
        seqs = [
            decoder.add(row_sequence(pipe, prompt_ids(pipe, p), pipe_settings(max_new_tokens=6)))
            for p in prompts
        ]
        return decoder, seqs

    decoder, seqs = decoder_with(PROMPTS[:3])  # nothing shared: all three in the first pass
    decoder.step()
    assert decoder.prefill_passes == 1 and all(s.prefilled == -1 for s in seqs)
    assert decoder.rows_per_pass == [3]
    decoder.run()
    for prompt, s in zip(PROMPTS[:3], seqs, strict=True):
        assert s.tokens == pipe.generate(prompt, max_new_tokens=6, k=0).token_ids

    system = "You are a careful assistant. "
    prompts = [system + p for p in PROMPTS[:3]]
    decoder, seqs = decoder_with(prompts)
    decoder.step()  # the first row reads the system prompt only; the others wait for it
    shared = len(pipe.encode_prompt(system)) - 2  # tokens at the seam may merge
    assert decoder.prefill_passes == 1 and decoder.rows_per_pass == []
    assert seqs[0].prefilled >= shared and [s.prefilled for s in seqs[1:]] == [0, 0]
    decoder.step()  # the other two copy it, and all three read the rest of their prompts
    assert decoder.prefill_passes == 2 and decoder.rows_per_pass == [3]
    assert min(s.stats.reused_prompt_tokens for s in seqs[1:]) >= shared > 8
    decoder.run()
    for prompt, s in zip(prompts, seqs, strict=True):
        assert s.tokens == pipe.generate(prompt, max_new_tokens=6, k=0).token_ids

    # rows joining while another row holds the system prompt both copy it at once
    decoder, seqs = decoder_with(prompts[:1])
    decoder.step()
    late = [system + p for p in PROMPTS[3:5]]
    seqs += [
        decoder.add(row_sequence(pipe, prompt_ids(pipe, p), pipe_settings(max_new_tokens=6)))
        for p in late
    ]
    decoder.step()
    assert decoder.prefill_passes == 2 and all(s.prefilled == -1 for s in seqs)
    assert min(s.stats.reused_prompt_tokens for s in seqs[1:]) >= shared
    decoder.run()
    for prompt, s in zip(prompts[:1] + late, seqs, strict=True):
        assert s.tokens == pipe.generate(prompt, max_new_tokens=6, k=0).token_ids


class _NeverDrafts:
    """A K policy that never drafts and keeps every step it is told of."""

    def __init__(self) -> None:
        self.steps: list[Any] = []

    def decide(self, source: str) -> Any:
        from specx.runtime.decode.policy import StepDecision

        return StepDecision(0)

    def observe(self, step: Any) -> None:
        self.steps.append(step)


def _lookup_offers(prompt: np.ndarray, steps: list[Any]) -> list[bool | None]:
    """Per step, recomputed from the committed tokens with a fresh lookup: whether the first
    token it offered before the step is the one the step committed (None: it offered none)."""
    from specx.runtime.drafters.ngram import NgramDrafter

    context, out = prompt.copy(), []
    for step in steps:
        offer = NgramDrafter().continuation(context)
        out.append(None if not offer.shape[0] else bool(offer[0] == step.tokens[0]))
        context = np.concatenate([context, step.tokens])
    return out


def test_a_step_that_drafts_nothing_tells_the_policy_whether_the_lookup_was_right(
    batched_llama: Any,
) -> None:
    """Alone and in a batch, a step that drafts nothing while a lookup had tokens to offer
    reports whether the lookup's first token is the one committed; no other step does."""
    from specx.runtime.batch.decoder import BatchDecoder
    from specx.runtime.decode.loop import decode_loop
    from specx.runtime.drafters.ngram import NgramDrafter

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    prompts = [prompt_ids(pipe, PROMPTS[i]) for i in (4, 0)]
    alone = _NeverDrafts()
    settings = pipe_settings(max_new_tokens=40)
    seq = row_sequence(pipe, prompts[0], settings, alone, NgramDrafter(), eos=())
    for _ in decode_loop(pipe.target, pipe.target.new_cache(pipe.manifest.max_length), seq):
        pass
    offers = _lookup_offers(prompts[0], alone.steps)
    assert [s.lookup_first_hit for s in alone.steps] == offers
    assert set(offers) == {True, False, None}  # offers right and wrong, and none

    decoder = BatchDecoder(pipe.batched_session().fork(), 2, 96, pipe.single_graph())
    rows = [_NeverDrafts() for _ in prompts]
    for p, policy in zip(prompts, rows, strict=True):
        settings = pipe_settings(max_new_tokens=24)
        decoder.add(row_sequence(pipe, p, settings, policy, NgramDrafter(), eos=()))
    decoder.run()
    for p, policy in zip(prompts, rows, strict=True):
        offers = _lookup_offers(p, policy.steps)
        assert [s.lookup_first_hit for s in policy.steps] == offers
        assert any(o is not None for o in offers)


def test_constrained_rows_with_logprobs_in_a_batch_equal_each_row_alone(batched_llama: Any) -> None:
    import json

    from specx.runtime import Grammar

    artifact, _ = batched_llama
    pipe = Pipeline.load(artifact)
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "boolean"},
        },
        "required": ["n", "b"],
        "additionalProperties": False,
    }
    grammar = Grammar.json_schema(schema, compact=True)  # a random model pads at random
    settings = [
        pipe_settings(max_new_tokens=40, drafter="mixed", k=3, grammar=grammar, logprobs=2),
        pipe_settings(max_new_tokens=20, drafter="ngram", k="auto", logprobs=0),  # free text
        pipe_settings(
            max_new_tokens=40, drafter="mixed", k="auto", grammar=Grammar("regex", "[a-c]{3,6}")
        ),
        pipe_settings(
            max_new_tokens=40, drafter="mixed", k=3, grammar=grammar, temperature=1.0, seed=5
        ),
    ]
    results = pipe.generate_batch(PROMPTS[:4], settings, max_batch=4)
    for prompt, setting, batched in zip(PROMPTS, settings, results, strict=False):
        alone = pipe.generate(prompt, setting)
        assert batched.token_ids == alone.token_ids
        if setting.logprobs is not None:
            assert batched.logprobs is not None and alone.logprobs is not None
            assert len(batched.logprobs) == len(batched.token_ids)
            for a, b in zip(batched.logprobs, alone.logprobs, strict=True):
                assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-4
                # alternatives the grammar forbids have no probability: not listed
                assert 1 <= len(a.top) <= setting.logprobs or setting.logprobs == 0
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert json.loads(results[0].text).keys() == {"n", "b"}
    assert json.loads(results[3].text).keys() == {"n", "b"}
    assert 3 <= len(results[2].text) <= 6 and set(results[2].text) <= set("abc")

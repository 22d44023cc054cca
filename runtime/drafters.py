"""Drafters: anything that proposes the next tokens cheaply.

One narrow interface (like transformers' ``CandidateGenerator``):

    start(prompt, sampling, rng)   a new generation begins with these prompt tokens
    source(context)                where the next proposal will come from ("model", "lookup",
                                   "none" when there is nothing to propose), asked before
                                   `propose` so that `-k auto` can choose K per source
    propose(context, k, plan)      up to k tokens that may follow `context` (every committed token);
                                   a drafter that knows its confidence asks `plan` after each
                                   token whether to take it and whether to draft another
    commit(num_accepted)           how many of the last proposal the target accepted

A drafter that samples returns the distributions it sampled from (``p_draft``), so that the
verifier can apply the rejection test; a deterministic drafter returns ``p_draft = None`` and its
tokens count as point masses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specx.runtime.sampling import SamplingParams, sample, warp
from specx.runtime.session import ModelSession


@dataclass(frozen=True)
class Proposal:
    tokens: np.ndarray  # [n] int64, n <= k
    p_draft: np.ndarray | None  # [n, target_vocab] or None (deterministic: point masses)
    confidence: np.ndarray | None = None  # [n] the draft's top probability at each token


# (position, the draft's top probability there) -> (take this token, draft another after it)
DraftPlan = Callable[[int, float], tuple[bool, bool]]


class Drafter(Protocol):
    name: str

    @property
    def model_passes(self) -> int:
        """Draft-model passes so far (0 for a lookup drafter)."""

    def start(
        self, prompt: np.ndarray, sampling: SamplingParams, rng: np.random.Generator
    ) -> None: ...

    def source(self, context: np.ndarray) -> str: ...

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal: ...

    def commit(self, num_accepted: int) -> None: ...


EMPTY = np.zeros(0, dtype=np.int64)
LOOKAHEAD = 64  # the most tokens a lookup continuation is read ahead (K never exceeds 16)


class ModelDrafter:
    """A draft model with its own preallocated cache.

    Invariant between calls: the cache holds a prefix of the committed tokens. ``propose`` feeds
    the committed tokens the cache lacks (one or two after a verify), then K - 1 drafted tokens
    one at a time; ``commit`` truncates the cache to what the target kept.
    """

    def __init__(
        self,
        session: ModelSession,
        capacity: int,
        target_vocab: int,
        eos_token_ids: tuple[int, ...] = (),
        name: str = "draft",
        min_confidence: float = 0.0,
    ) -> None:
        self.name = name
        # Stop proposing once the draft's own top probability falls below this (0: never);
        # llama.cpp's --draft-p-min, transformers' assistant_confidence_threshold.
        self.min_confidence = min_confidence
        self.session = session
        self.cache = session.new_cache(capacity)
        self.target_vocab = target_vocab
        # Tokens both models can emit; the rest are padding rows of the larger vocabulary.
        self.shared_vocab = min(session.vocab_size, target_vocab)
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        self._sampling = SamplingParams()
        self._rng = np.random.default_rng(0)
        self._context_len = 0
        self._fed_from_proposal = 0
        self.last_catchup = 0

    @property
    def model_passes(self) -> int:
        return self.session.passes  # this drafter's own fork of the session

    def _input(self, tokens: np.ndarray) -> np.ndarray:
        # A target padding-row id (possible only with untrained targets) is not a valid draft
        # input; feed token 0 instead. The draft then guesses worse, the output stays exact.
        if tokens.size and int(tokens.max()) >= self.session.vocab_size:
            return np.where(tokens < self.session.vocab_size, tokens, 0)
        return tokens

    def start(self, prompt: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> None:
        self._sampling = sampling
        self._rng = rng
        self.cache.reset()
        if prompt.shape[0] > 1:
            self.session.prefill(self._input(prompt[:-1]), self.cache)

    def _next(self, logits: np.ndarray, want_top: bool) -> tuple[int, np.ndarray | None, float]:
        """(token, its distribution over the target vocab or None if greedy, top probability)."""
        row = logits[: self.shared_vocab]
        if self._sampling.greedy:
            token = int(np.argmax(row))
            top = 1.0
            if want_top:
                top = float(1.0 / np.sum(np.exp(row - row[token])))  # softmax at the argmax
            return token, None, top
        probs = warp(row, self._sampling)  # [shared_vocab]
        token = sample(probs, self._rng)
        full = np.zeros(self.target_vocab, dtype=np.float64)  # [target_vocab]
        full[: self.shared_vocab] = probs
        return token, full, float(probs.max())

    def source(self, context: np.ndarray) -> str:
        return "model"

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        self._context_len = int(context.shape[0])
        self._fed_from_proposal = 0
        if k <= 0:
            return Proposal(EMPTY, None)
        pending = context[self.cache.length :]  # committed tokens the draft has not seen
        self.last_catchup = int(pending.shape[0])
        logits = self.session.prefill(self._input(pending), self.cache)  # a view: used at once
        assert logits is not None
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        tops: list[float] = []
        want_top = plan is not None or self.min_confidence > 0.0
        for i in range(k):
            token, probs, top = self._next(logits, want_top)
            if i > 0 and top < self.min_confidence:
                break  # the draft is unsure: verify what we have
            take, more = plan(i, top) if plan is not None else (True, True)
            if not take:
                break
            tokens.append(token)
            tops.append(top)
            if probs is not None:
                rows.append(probs)
            if not more or i == k - 1 or (self.eos.size and token in self.eos):
                break
            logits = self.session.forward(self._input(np.array([token])), self.cache)[0]
            self._fed_from_proposal += 1
        p_draft = np.stack(rows) if rows else None  # [n, target_vocab]
        confidence = np.asarray(tops) if want_top else None  # [n]
        return Proposal(np.asarray(tokens, dtype=np.int64), p_draft, confidence)

    def commit(self, num_accepted: int) -> None:
        kept = self._context_len + min(num_accepted, self._fed_from_proposal)
        self.cache.truncate(min(kept, self.cache.length))


class NgramDrafter:
    """Prompt lookup (Saxena 2023): propose what followed the latest earlier occurrence of the
    context's last n tokens, for n from max_ngram down to min_ngram. No model; the only state is
    the current step's search result.

    The search is one vectorized comparison per n over the context (numpy sliding windows), so
    it costs microseconds even for thousands of tokens. Proposals stop after an EOS token.
    """

    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, eos_token_ids: tuple[int, ...] = ()
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.name = "ngram"
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        self.model_passes = 0
        self._found: tuple[int, np.ndarray] = (-1, EMPTY)  # (context length, continuation)

    def start(self, prompt: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> None:
        self._found = (-1, EMPTY)  # nothing looked up yet

    def continuation(self, context: np.ndarray) -> np.ndarray:
        """What followed the best earlier match of the context's suffix (up to LOOKAHEAD tokens,
        cut after an EOS), or nothing. Kept until the step's `propose`, so one step searches
        once however often it asks."""
        length = int(context.shape[0])
        if self._found[0] != length:
            self._found = (length, self._search(context, length))
        return self._found[1]

    def forget(self) -> None:
        """The step is over: the next context is a new one."""
        self._found = (-1, EMPTY)

    def _search(self, context: np.ndarray, length: int) -> np.ndarray:
        if length < 2:
            return EMPTY
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            pattern = context[length - n :]  # [n]
            # windows over context[:-1] so that every match is followed by at least one token
            windows = np.lib.stride_tricks.sliding_window_view(context[: length - 1], n)
            hits = np.flatnonzero(np.all(windows == pattern, axis=1))  # starts of matches
            if hits.size == 0:
                continue
            start = int(hits[-1]) + n  # the latest occurrence: closest to the current topic
            tokens = context[start : start + LOOKAHEAD]
            if self.eos.size:
                stops = np.flatnonzero(np.isin(tokens, self.eos))
                if stops.size:
                    tokens = tokens[: int(stops[0]) + 1]
            return tokens.astype(np.int64, copy=True)
        return EMPTY

    def source(self, context: np.ndarray) -> str:
        return "lookup" if self.continuation(context).size else "none"

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        """`plan` is not asked: a lookup has no confidence, and its tokens cost nothing."""
        found = self.continuation(context)
        self.forget()
        return Proposal(found[:k] if k > 0 else EMPTY, None)

    def commit(self, num_accepted: int) -> None:
        """Nothing to keep: the next lookup reads the updated context."""


class HybridDrafter:
    """n-gram lookup first, a draft model when the lookup finds nothing (like "lookahead" plus a
    draft). Lookups are free and often long on input-grounded or repetitive text; the model covers
    the rest. The model's cache only catches up when it is used."""

    def __init__(
        self, lookup: NgramDrafter, model: ModelDrafter, min_match_tokens: int = 2
    ) -> None:
        self.name = f"ngram+{model.name}"
        self.lookup = lookup
        self.model = model
        self.min_match_tokens = min_match_tokens
        self._used_model = False

    @property
    def model_passes(self) -> int:
        return self.model.model_passes

    @property
    def last_catchup(self) -> int:
        return self.model.last_catchup if self._used_model else 0

    def start(self, prompt: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> None:
        self.lookup.start(prompt, sampling, rng)
        self.model.start(prompt, sampling, rng)

    def source(self, context: np.ndarray) -> str:
        matched = self.lookup.continuation(context).shape[0] >= self.min_match_tokens
        return "lookup" if matched else "model"

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        self._used_model = self.source(context) == "model"
        if self._used_model:
            self.lookup.forget()
            return self.model.propose(context, k, plan)
        return self.lookup.propose(context, k)

    def commit(self, num_accepted: int) -> None:
        if self._used_model:
            self.model.commit(num_accepted)

"""Suffix drafting over everything already generated (SuffixDecoding, Oliaro et al. 2024; vLLM's
``method: "suffix"``): no model; proposals come from the current context and from earlier
generations of the same scope (a tenant) served by this process.

A proposal starts from the longest suffix of the context (up to MAX_DEPTH tokens) found in a
corpus: first the context itself, then the scope's history of earlier outputs. Among the most
recent occurrences of that suffix (up to MAX_OCCURRENCES) it follows, token by token, the
continuation seen most often, and estimates each token's probability as the share of the
occurrences that went on that way (the product along the path, as the suffix tree's counts give
it). It stops where that estimate falls below MIN_PROBABILITY, after an end token, or after
ceil(SPEC_FACTOR x the match length) tokens: a long match proposes a long run, a one-token match a
short one, and no match nothing. Of the context's proposal and the history's, the one with the
larger expected length (the sum of its probabilities) is taken.

The source it reports is a lookup named by the match length's bucket (lookup1, 2, 3, 4, 8, 16),
so -k auto learns acceptance per match length as it does for n-gram lookup; each token's estimate
is reported as its confidence, which -k auto's drafting plan reads as for a draft model.

Occurrences are found by hashed n-grams (n = 4, else 2, else 1) and checked token by token, so a
hash collision costs time, never a wrong match. The context's index grows a step's new tokens at a
time; the history's is rebuilt when a generation of its scope ends (bounded: HistoryBounds).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from specx.runtime.drafters.base import (
    EMPTY,
    NONE,
    DraftPlan,
    DraftRequest,
    Proposal,
    lookup_source,
)

MAX_DEPTH = 64  # the longest suffix matched (SuffixDecoding's tree depth)
MAX_OCCURRENCES = 256  # the most recent occurrences of a suffix whose continuations are read
MIN_PROBABILITY = 0.1  # a proposal stops where its estimated probability falls below this
SPEC_FACTOR = 1.0  # a match of m tokens proposes at most ceil(SPEC_FACTOR * m) tokens
LOOKAHEAD = 64  # the most tokens a proposal holds (K never exceeds 16)
PROMPT_TAIL = 32  # prompt tokens kept before each output in the history: a repeated request
# is drafted from its first token
ANCHORS = (4, 2, 1)  # n-gram lengths an occurrence is looked up by, longest first
SOURCE_BUCKETS = (1, 2, 3, 4, 8, 16)  # match lengths -k auto keeps apart (the bucket's floor)
SEPARATOR = -1  # between the history's documents: matches no token
_PRIME = 0x100000001B3  # FNV's 64-bit prime: a gram's hash is sum (token + 1) * PRIME^j mod 2^64


def match_source(length: int) -> str:
    """The source of a proposal after a match of `length` tokens (lookup + the bucket's floor)."""
    return lookup_source(max(b for b in SOURCE_BUCKETS if b <= length))


def gram_hashes(tokens: np.ndarray, start: int, n: int) -> np.ndarray:
    """[len(tokens) - start] the hash of the n-gram ending at each position from `start` (the
    tokens before position 0 count as SEPARATOR)."""
    out = np.zeros(tokens.shape[0] - start, dtype=np.uint64)
    factor = 1
    for j in range(n):
        lo = start - j
        shifted = np.full(out.shape[0], SEPARATOR, dtype=np.int64)
        first = max(0, -lo)  # positions whose token j back lies before the start
        shifted[first:] = tokens[lo + first : tokens.shape[0] - j]
        out += (shifted + 1).astype(np.uint64) * np.uint64(factor)
        factor = factor * _PRIME % 2**64
    return out


@dataclass
class TokenIndex:
    """A corpus of token ids and the hashes of its n-grams (n in ANCHORS), growing at the end."""

    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    hashes: dict[int, np.ndarray] = field(default_factory=dict)
    size: int = 0

    def extend(self, tokens: np.ndarray) -> None:
        """Append `tokens` (their grams may span the old end)."""
        n_new = int(tokens.shape[0])
        need = self.size + n_new
        if need > self.tokens.shape[0]:  # doubled: no copy per step
            grown = np.empty(max(2 * need, 256), dtype=np.int64)
            grown[: self.size] = self.tokens[: self.size]
            self.tokens = grown
            for n in ANCHORS:
                bigger = np.zeros(grown.shape[0], dtype=np.uint64)
                bigger[: self.size] = self.hashes[n][: self.size] if n in self.hashes else 0
                self.hashes[n] = bigger
        self.tokens[self.size : need] = tokens
        for n in ANCHORS:
            self.hashes[n][self.size : need] = gram_hashes(self.tokens[:need], self.size, n)
        self.size = need

    def truncate(self, size: int) -> None:
        self.size = min(self.size, size)

    def longest_match(self, context: np.ndarray, end: int) -> tuple[np.ndarray, int]:
        """(the ends of the most recent occurrences, at most MAX_OCCURRENCES, of the longest
        suffix of `context` ending before position `end` of the corpus, oldest first; its
        length); (EMPTY, 0) where not even its last token occurs."""
        length = int(context.shape[0])
        end = min(end, self.size)
        for n in ANCHORS:
            if length < n or end <= 0:
                continue
            wanted = gram_hashes(context[length - n :], n - 1, n)[0]
            ends = np.flatnonzero(self.hashes[n][:end] == wanted)[-MAX_OCCURRENCES:]
            if not ends.size:
                continue
            depth = min(MAX_DEPTH, length)
            back = ends[:, None] - np.arange(depth)[None, :]  # [occurrences, depth]
            behind = context[length - 1 - np.arange(depth)]  # [depth] the suffix, reversed
            same = (back >= 0) & (self.tokens[np.maximum(back, 0)] == behind[None, :])
            lengths = np.where(same.all(axis=1), depth, same.argmin(axis=1))
            best = int(lengths.max())
            if best >= n:  # (shorter: hash collisions only)
                return ends[lengths == best], best
        return EMPTY, 0


def follow(
    index: TokenIndex, ends: np.ndarray, matched: int, eos: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The continuation most often seen after the occurrences ending at `ends` (oldest first):
    (tokens, each one's estimated probability), as the module's rules cut it."""
    rows = ends[::-1]  # most recent first: ties go to the most recent continuation
    most = min(LOOKAHEAD, math.ceil(SPEC_FACTOR * matched))
    tokens: list[int] = []
    probs: list[float] = []
    p = 1.0
    for depth in range(most):
        reached = int(rows.shape[0])  # occurrences that got this far (some may end here)
        at = rows + 1 + depth
        inside = at < index.size
        rows, following = rows[inside], index.tokens[at[inside]]
        going = following != SEPARATOR
        rows, following = rows[going], following[going]
        if not rows.size:
            break
        values, first, counts = np.unique(following, return_index=True, return_counts=True)
        pick = max(range(values.shape[0]), key=lambda i: (counts[i], -first[i]))
        p *= float(counts[pick]) / reached
        if p < MIN_PROBABILITY:
            break
        token = int(values[pick])
        tokens.append(token)
        probs.append(p)
        rows = rows[following == token]
        if eos.size and token in eos:
            break
    return np.asarray(tokens, dtype=np.int64), np.asarray(probs, dtype=np.float64)


@dataclass(frozen=True)
class HistoryBounds:
    tokens_per_scope: int = 1 << 18  # a scope's earlier outputs kept (its oldest go first)
    tokens: int = 1 << 21  # all scopes' together (the least recently used scope goes first)


class SuffixHistory:
    """Earlier generations' outputs, per scope, for the suffix drafters of one pipeline: bounded,
    and updated as each generation ends."""

    def __init__(self, bounds: HistoryBounds | None = None) -> None:
        self.bounds = bounds or HistoryBounds()
        self._docs: OrderedDict[str, list[np.ndarray]] = OrderedDict()
        self._index: dict[str, TokenIndex] = {}
        self._lock = threading.Lock()

    @property
    def tokens(self) -> int:
        with self._lock:
            return sum(sum(int(d.shape[0]) for d in docs) for docs in self._docs.values())

    def add(self, scope: str, output: np.ndarray) -> None:
        """A generation of `scope` ended with these tokens (its output, after its prompt's
        last PROMPT_TAIL tokens)."""
        if not output.shape[0]:
            return
        with self._lock:
            docs = self._docs.setdefault(scope, [])
            docs.append(np.asarray(output, dtype=np.int64).copy())
            self._docs.move_to_end(scope)
            while sum(int(d.shape[0]) for d in docs) > self.bounds.tokens_per_scope:
                docs.pop(0)
            total = sum(sum(int(d.shape[0]) for d in ds) for ds in self._docs.values())
            while total > self.bounds.tokens and len(self._docs) > 1:
                gone = next(iter(self._docs))
                total -= sum(int(d.shape[0]) for d in self._docs.pop(gone))
                self._index.pop(gone, None)
            index = TokenIndex()
            for doc in docs:
                index.extend(np.append(doc, SEPARATOR))
            self._index[scope] = index  # a new object: drafters reading the old one go on

    def index(self, scope: str) -> TokenIndex | None:
        with self._lock:
            return self._index.get(scope)


class SuffixDrafter:
    def __init__(self, history: SuffixHistory | None, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.name = "suffix"
        self.history = history
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        self._context = TokenIndex()
        self._scope: str | None = None
        self._prompt_tail = EMPTY
        # (context length, proposal tokens, their probabilities, match length)
        self._found: tuple[int, np.ndarray, np.ndarray, int] = (-1, EMPTY, EMPTY, 0)

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        self._scope = request.scope
        self._prompt_tail = prompt[-PROMPT_TAIL:].copy()
        self._context = TokenIndex()
        self.forget()

    def forget(self) -> None:
        """The step is over: the next context is a new one."""
        self._found = (-1, EMPTY, EMPTY, 0)

    def continuation(self, context: np.ndarray) -> np.ndarray:
        """The proposal for this context (searched once per context length)."""
        length = int(context.shape[0])
        if self._found[0] != length:
            self._found = (length, *self._search(context))
        return self._found[1]

    def _search(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(tokens, probabilities, match length) of the better of the context's and the
        history's proposals."""
        self._index_context(context)
        length = int(context.shape[0])
        best: tuple[np.ndarray, np.ndarray, int] = (EMPTY, EMPTY, 0)
        corpora = [(self._context, length - 1)]  # an occurrence must be followed by a token
        history = (
            self.history.index(self._scope) if self.history and self._scope is not None else None
        )
        if history is not None:
            corpora.append((history, history.size))
        for index, end in corpora:
            ends, matched = index.longest_match(context, end)
            if matched:
                tokens, probs = follow(index, ends, matched, self.eos)
                # summed in order (libspecx sums the same way: the same choice at a near-tie)
                if sum(probs.tolist()) > sum(best[1].tolist()):
                    best = (tokens, probs, matched)
        return best

    def _index_context(self, context: np.ndarray) -> None:
        """Index the context's new tokens; a context that does not extend the one indexed (a
        drafter reused for another prompt without a start) is indexed anew."""
        index, length = self._context, int(context.shape[0])
        done = index.size
        if done > length or not (index.tokens[:done] == context[:done]).all():
            index.truncate(0)
            done = 0
        if length > done:
            index.extend(context[done:length])

    def source(self, context: np.ndarray) -> str:
        found = self.continuation(context)
        return match_source(self._found[3]) if found.size else NONE

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        """Up to k tokens of the proposal; `plan` (-k auto's) takes or stops at each token
        given its estimated probability."""
        self.continuation(context)
        _, tokens, probs, _ = self._found
        self.forget()
        taken = 0
        for i in range(min(k, int(tokens.shape[0]))):
            take, more = plan(i, float(probs[i])) if plan is not None else (True, True)
            taken += int(take)
            if not take or not more:
                break
        return Proposal(tokens[:taken], confidence=probs[:taken])

    def commit(self, num_accepted: int) -> None:
        """Nothing to keep: the next search reads the updated context."""

    def finish(self, output: np.ndarray) -> None:
        """The generation ended with these new tokens: its scope's history keeps them."""
        if self.history is not None and self._scope is not None and output.shape[0]:
            self.history.add(self._scope, np.concatenate([self._prompt_tail, output]))

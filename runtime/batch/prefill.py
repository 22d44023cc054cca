"""How joining rows read their prompts in a batch: one chunk a step, several rows in one pass,
a prompt prefix another row of the same scope holds (a shared system prompt; an earlier turn of
the conversation a freed row still holds) copied instead of computed.

The BatchDecoder (decoder.py) holds the rows and asks its PromptReader to read a chunk of the
joining rows' prompts at the start of each step while any row is joining.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from specx.runtime.drafters.base import FeatureReader, reads_prompt_features
from specx.runtime.kv_cache import common_prefix
from specx.runtime.prefix.cache import COPIED

if TYPE_CHECKING:
    from specx.runtime.backends.base import BatchedGraph
    from specx.runtime.decode.sequence import Sequence
    from specx.runtime.kv_cache import BatchKVCache
    from specx.runtime.prefix.cache import PrefixCache


class PromptReader:
    """The rows' prefill: what BatchDecoder.step runs first while any row is still joining."""

    PREFILL_CHUNK = 64  # prompt tokens a joining row feeds per step
    PREFILL_BUDGET = 128  # positions (rows x width, padding included) of a step's prefill pass
    SHARED_PREFIX_MIN = 8  # prompt tokens worth copying from another row instead of computing

    def __init__(
        self,
        session: BatchedGraph,
        single: BatchedGraph | None,
        cache: BatchKVCache,
        prefixes: PrefixCache | None = None,
    ) -> None:
        """session: the batched graph; single: the target's gqa graph where the decoder has it
        (a pass over one row runs there); cache: the decoder's rows; prefixes: the pipeline's
        prompt reuse (None: rows copy nothing from each other)."""
        self.session = session
        self.single = single
        self.cache = cache
        self.prefixes = prefixes
        self.passes = 0  # passes that read prompt chunks

    def read(self, joining: list[Sequence]) -> None:
        """Feed the next prompt chunk of the joining rows (each row's prompt but its last token,
        which its first step feeds), in one pass where several join at once: at most
        PREFILL_CHUNK tokens of a row and PREFILL_BUDGET padded positions a step, so that a long
        prompt never stalls the decoding rows for long. A prompt prefix another row holds (a
        shared system prompt) is copied from that row instead of computed; a row whose prefix
        an earlier joining row is still computing waits a step for it rather than compute it
        too, and that row reads only up to the prefix they share, so that in the next step they
        all read the rest of their prompts in one pass."""
        t0 = perf_counter()
        parts: dict[int, tuple[Sequence, int, int]] = {}  # row -> (seq, start, end)
        for i, s in enumerate(joining):
            if not s.reading:
                if any(self._waits_for(s, earlier) for earlier in joining[:i]):
                    continue
                self._reuse_prefix(s)
                s.reading = True
            end = min(s.prefilled + self.PREFILL_CHUNK, s.n_context - 1)
            # rows waiting for a prefix s computes: s stops there, they join its next chunk
            waiting = [self._waits_for(later, s) for later in joining[i + 1 :]]
            shared = [c for c in waiting if c and s.prefilled < c < end]
            end = max(shared, default=end)
            rows = [*parts, s.row]
            width = max([end - s.prefilled] + [e - b for _, b, e in parts.values()])
            if parts and (max(rows) - min(rows) + 1) * width > self.PREFILL_BUDGET:
                break
            parts[s.row] = (s, s.prefilled, end)
        fed = {row: part for row, part in parts.items() if part[2] > part[1]}
        if len(fed) == 1 or (fed and not self._feed_together(fed)):
            for row, part in fed.items():  # one row (the gqa graph's fused pass, where there)
                self._feed({row: part}, self.single or self.session)
        for s, _, end in parts.values():
            s.prefilled = end if end < s.n_context - 1 else -1
            s.stats.prefill_s += perf_counter() - t0
            s.decode_start = perf_counter()

    def _waits_for(self, s: Sequence, other: Sequence) -> int:
        """The prompt prefix s shares with a row of its scope still computing it, if worth
        copying and longer than any row holds now (0: s need not wait for `other`)."""
        scope = s.settings.cache_scope
        if not self._copies(s) or scope is None or other.settings.cache_scope != scope:
            return 0
        prompt = s.context[: s.n_context - 1]
        shared = common_prefix(prompt, other.context[: other.n_context - 1])
        if shared < self.SHARED_PREFIX_MIN or int(self.cache.lengths[other.row]) >= shared:
            return 0
        rows = range(self.cache.rows)
        held = max(self.cache.shared_prefix(r, prompt, scope) for r in rows if r != s.row)
        return shared if shared > max(held, s.prefilled) else 0

    def _feed_together(self, fed: dict[int, tuple[Sequence, int, int]]) -> bool:
        """One batched pass over the rows first .. last of `fed` (rows between them take no
        token); False if a row in that range lacks the room for the pass."""
        first, last = min(fed), max(fed)
        width = max(e - b for _, b, e in fed.values())
        if int(self.cache.lengths[first : last + 1].max()) + width > self.cache.capacity:
            return False
        self._feed(fed, self.session)
        return True

    def _feed(self, fed: dict[int, tuple[Sequence, int, int]], runner: BatchedGraph) -> None:
        first, last = min(fed), max(fed)
        width = max(e - b for _, b, e in fed.values())
        tokens = np.zeros((last - first + 1, width), dtype=np.int64)  # [rows, width], 0: padding
        counts = np.zeros(last - first + 1, dtype=np.int64)
        for row, (s, begin, end) in fed.items():
            tokens[row - first, : end - begin] = s.context[begin:end]
            counts[row - first] = end - begin
        runner.forward_rows(tokens, counts, self.cache, first)
        self.passes += 1
        features = runner.last_features  # [rows, width, F] where the graph returns features
        for row, (s, begin, end) in fed.items():
            if features is not None and isinstance(s.drafter, FeatureReader):
                # (a hybrid is a FeatureReader whether or not its model reads them: a feature
                # draft left without them says so when it drafts)
                s.drafter.observe_features(begin, features[row - first, : end - begin])

    def _copies(self, s: Sequence) -> bool:
        """Whether s may copy a prefix from another row: unless prompt reuse is off, in host
        memory, and not for a feature draft (it needs the target's features of every prompt
        position)."""
        return (
            (self.prefixes is None or self.prefixes.enabled)
            and self.cache.on_host
            and not reads_prompt_features(s.drafter)
        )

    def _reuse_prefix(self, s: Sequence) -> None:
        """Copy into s's row the longest prefix of its prompt that another row of its scope
        holds (at least SHARED_PREFIX_MIN tokens more than the row has)."""
        if not self._copies(s):
            return
        have = int(self.cache.lengths[s.row])
        prompt = s.context[: s.n_context - 1]  # what the prefill feeds
        got = self.cache.reuse_prefix(s.row, prompt, have + self.SHARED_PREFIX_MIN)
        if got > have:
            s.prefilled = got  # the chunk loop reads from here (and sees when nothing is left)
            s.stats.reused_prompt_tokens = got
            s.stats.prompt_cache, s.stats.prompt_cache_note = COPIED, ""
            if self.prefixes is not None:
                self.prefixes.record_copy(got - have)

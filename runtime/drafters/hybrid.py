"""A lookup first, a draft model when the lookup finds nothing (like "lookahead" plus a draft):
``ngram+X`` (prompt lookup) or ``suffix+X`` (suffix drafting over the context and earlier
generations). Lookups are free and often long on input-grounded or repetitive text; the model
covers the rest. The model's cache only catches up when it is used."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.drafters.base import (
    MODEL,
    Drafter,
    DraftPlan,
    DraftRequest,
    FeatureReader,
    Proposal,
    ProposalSteps,
    SharedPassDrafter,
    tokens_behind,
)
from specx.runtime.drafters.ngram import NgramDrafter
from specx.runtime.drafters.suffix import SuffixDrafter

if TYPE_CHECKING:
    from specx.runtime.drafters.shared_passes import DraftRows

PREFIX = "ngram+"  # a hybrid's name: ngram+NAME, NAME a model draft of the artifact
SUFFIX_PREFIX = "suffix+"  # or suffix+NAME: suffix drafting in front of the model
PREFIXES = (PREFIX, SUFFIX_PREFIX)


class HybridDrafter:
    def __init__(
        self, lookup: NgramDrafter | SuffixDrafter, model: Drafter, min_match_tokens: int = 2
    ) -> None:
        self.name = f"{lookup.name}+{model.name}"
        self.lookup = lookup
        self.model = model
        self.min_match_tokens = min_match_tokens
        self._used_model = False
        # what the model can do, asked once (a protocol check is slow for a per-step question)
        self._model_shares = isinstance(model, SharedPassDrafter)

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        self.lookup.start(prompt, request)
        self.model.start(prompt, request)

    def source(self, context: np.ndarray) -> str:
        matched = self.lookup.continuation(context).shape[0] >= self.min_match_tokens
        return self.lookup.source(context) if matched else MODEL

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        self._used_model = self.source(context) == MODEL
        if self._used_model:
            self.lookup.forget()
            return self.model.propose(context, k, plan)
        return self.lookup.propose(context, k, plan)

    def behind(self, context: np.ndarray) -> int:
        """What the model must read before it proposes (-k auto charges it to model steps)."""
        return tokens_behind(self.model, context)

    # a batch shares the model's passes (the lookups cost nothing to share)
    def draft_session(self, source: str) -> GraphSession | None:
        if source == MODEL and self._model_shares:
            return cast(SharedPassDrafter, self.model).draft_session(MODEL)
        return None

    def bind_row(self, rows: DraftRows | None, row: int = 0) -> None:
        if isinstance(self.model, SharedPassDrafter):
            self.model.bind_row(rows, row)

    def proposal_steps(
        self, context: np.ndarray, k: int, plan: DraftPlan | None = None
    ) -> ProposalSteps:
        """The model's proposal as steps (asked only when `source` says MODEL)."""
        assert self._model_shares
        self._used_model = True
        self.lookup.forget()
        return cast(SharedPassDrafter, self.model).proposal_steps(context, k, plan)

    def commit(self, num_accepted: int) -> None:
        if self._used_model:
            self.model.commit(num_accepted)

    def finish(self, output: np.ndarray) -> None:
        """The generation ended: a suffix lookup keeps its output for later ones."""
        if isinstance(self.lookup, SuffixDrafter):
            self.lookup.finish(output)

    def observe_features(self, position: int, features: np.ndarray) -> None:
        """Passed on to a feature draft (a draft model reads none)."""
        if isinstance(self.model, FeatureReader):
            self.model.observe_features(position, features)

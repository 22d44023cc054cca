"""The drafter seam: anything that proposes the next tokens cheaply.

One narrow interface (like transformers' ``CandidateGenerator``, vLLM's proposers):

    start(prompt, request)         a new generation begins with these prompt tokens and settings
    source(context)                where the next proposal will come from ("model", "lookup3"
                                   for a lookup after a 3-token match, "none" when there is
                                   nothing to propose), asked before
                                   `propose` so that `-k auto` can choose K per source
    propose(context, k, plan)      up to k tokens that may follow `context` (every committed token);
                                   a drafter that knows its confidence asks `plan` after each
                                   token whether to take it and whether to draft another
    commit(num_accepted)           how many of the last proposal the target accepted

A drafter that runs a draft model may also implement ``SharedPassDrafter``: a batch then keeps
its draft cache as a row of one shared cache and runs the proposals of all such rows in lockstep,
one pass per drafted position for every row (drafters/shared_passes.py). A feature draft also
implements ``FeatureReader``: the loops then hand it the target's features
(``observe_features(position, f)``: the rows of the committed positions position ..
+ len(f) - 1, from the pass that put them in the target's cache). Other drafters need nothing
of it.

Everything a step learns about drafting comes back in the ``Proposal``'s declared fields (the
tokens, their distributions or confidences, the catch-up and model passes it cost): callers never
read a drafter's internals. A drafter is one module in this package plus one entry in
registry.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.verification.sampling import PositionNoise, SamplingParams

if TYPE_CHECKING:
    from specx.runtime.drafters.shared_passes import DraftRows
    from specx.runtime.prefix.cache import PrefixCache

# Where a proposal comes from; -k auto keeps its estimates per source.
MODEL = "model"  # a draft model: a pass per drafted token
# a lookup in the text so far: free, and needs no commit (a step that drafts nothing may ask it
# for one token to learn its acceptance: sequence.lookup_guess). A lookup's source is named by
# how many of the context's last tokens matched (lookup_source): a continuation found after a
# 3-token match is right several times as often as one after a single token
# (docs/bench/measurements.md)
LOOKUP = "lookup"
NONE = "none"  # nothing to propose: the step is a plain decode step

EMPTY = np.zeros(0, dtype=np.int64)


def lookup_source(matched: int) -> str:
    """The source of a lookup whose continuation follows a match of `matched` tokens."""
    return f"{LOOKUP}{matched}"


def is_lookup(source: str) -> bool:
    """Whether proposals from `source` are lookups (free, and need no commit)."""
    return source.startswith(LOOKUP)


# (position in the proposal, the draft's top probability there) -> (take this token, draft more)
DraftPlan = Callable[[int, float], tuple[bool, bool]]


@dataclass(frozen=True)
class Proposal:
    tokens: np.ndarray  # [n] int64, n <= k
    p_draft: np.ndarray | None = None  # [n, target_vocab]: rejection sampling only; else None
    confidence: np.ndarray | None = None  # [n] the draft's top probability at each token
    catchup: int = 0  # committed tokens the drafter fed to its model before drafting
    model_passes: int = 0  # draft-model passes this proposal cost

    def head(self, n: int) -> Proposal:
        """The proposal's first n tokens (a grammar cuts what it could never accept)."""
        if n >= self.tokens.shape[0]:
            return self
        return dataclasses.replace(
            self,
            tokens=self.tokens[:n],
            p_draft=None if self.p_draft is None else self.p_draft[:n],
            confidence=None if self.confidence is None else self.confidence[:n],
        )


NO_PROPOSAL = Proposal(EMPTY)

# A proposal as steps: yields the tokens of each draft pass, is sent that pass's last logits row
# ([vocab]), returns the proposal.
ProposalSteps = Generator[np.ndarray, np.ndarray, Proposal]


class DraftGrammar(Protocol):
    """The grammar of a constrained generation as a model drafter walks it while proposing
    (constraint.Constraint): it proposes only what the grammar allows, so structure the grammar
    forces is drafted (and accepted) instead of refused."""

    def draft_allowed(self) -> np.ndarray:
        """[target vocab] bool: what may follow the committed and the pushed tokens."""
        ...

    def draft_push(self, token: int) -> bool:
        """Walk past a drafted token; False when the grammar refuses it (the proposal ends
        before it)."""
        ...

    def draft_end(self) -> None:
        """The proposal is done: forget the pushed tokens."""
        ...


@dataclass(frozen=True)
class DraftRequest:
    """What a generation tells its drafter when it starts: the settings of this generation."""

    sampling: SamplingParams
    noise: PositionNoise  # the generation's keyed random numbers (shared with the verifier)
    min_confidence: float = 0.0  # a model draft stops below this top probability (0: never)
    # a draft model reads the prompt at start (True), or only when first asked to propose (a
    # batch row whose K may stay 0 then never pays for it)
    prefill: bool = True
    grammar: DraftGrammar | None = None  # a constrained generation's grammar
    # prompt reuse (runtime/prefix): a draft model keeps the prefix of the prompt its cache holds
    # for this scope (None: the scope reuses nothing), and the pipeline's store where it has one
    scope: str | None = None
    prefixes: PrefixCache | None = None


class Drafter(Protocol):
    name: str

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None: ...

    def source(self, context: np.ndarray) -> str: ...

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal: ...

    def commit(self, num_accepted: int) -> None: ...


@runtime_checkable
class FeatureReader(Protocol):
    """A drafter that reads the target's hidden states (a feature draft)."""

    def observe_features(self, position: int, features: np.ndarray) -> None: ...


@runtime_checkable
class CatchesUp(Protocol):
    """A drafter whose model reads the committed tokens it has not seen before it proposes."""

    def behind(self, context: np.ndarray) -> int:
        """How many of `context` (every committed token) its model has not read yet."""
        ...


def tokens_behind(drafter: Drafter | None, context: np.ndarray) -> int:
    """What a model drafter must read before its next proposal (0 for the others)."""
    return drafter.behind(context) if isinstance(drafter, CatchesUp) else 0


@runtime_checkable
class HistoryKeeper(Protocol):
    """A drafter that learns from whole generations (suffix drafting keeps their outputs)."""

    def finish(self, output: np.ndarray) -> None:
        """The generation ended with these new tokens ([n])."""
        ...


def reads_prompt_features(drafter: Drafter | None) -> bool:
    """Whether the drafter needs the target's features of every prompt position (a feature
    draft, alone or behind a lookup): then no prompt prefix may be reused, since the target
    would not compute the features of the reused positions."""
    inner = getattr(drafter, "model", drafter)  # a hybrid's model
    return isinstance(inner, FeatureReader) and getattr(inner, "needs_features", False)


@runtime_checkable
class SharedPassDrafter(Protocol):
    """A drafter whose draft-model passes a batch may share with other rows' (shared_passes.py)."""

    def draft_session(self, source: str) -> GraphSession | None:
        """The draft model a proposal from `source` runs; None: no model pass to share."""
        ...

    def bind_row(self, rows: DraftRows | None, row: int = 0) -> None:
        """Keep the draft cache in row `row` of `rows` (None: the drafter's own cache again)."""
        ...

    def proposal_steps(
        self, context: np.ndarray, k: int, plan: DraftPlan | None = None
    ) -> ProposalSteps:
        """What `propose` does, as steps whose passes the caller runs."""
        ...

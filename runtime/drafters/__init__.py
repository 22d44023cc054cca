"""Drafters behind one seam (base.py), one module each, built through one registry."""

from specx.runtime.drafters.base import (
    LOOKUP,
    MODEL,
    NO_PROPOSAL,
    NONE,
    Drafter,
    DraftPlan,
    DraftRequest,
    Proposal,
    is_lookup,
    lookup_source,
)
from specx.runtime.drafters.hybrid import HybridDrafter
from specx.runtime.drafters.model import ModelDrafter
from specx.runtime.drafters.ngram import NgramDrafter
from specx.runtime.drafters.registry import (
    KINDS,
    NO_DRAFTER,
    DrafterKind,
    DraftResources,
    build_drafter,
    default_drafter,
    drafter_names,
)
from specx.runtime.drafters.suffix import SuffixDrafter, SuffixHistory

__all__ = [
    "KINDS",
    "LOOKUP",
    "MODEL",
    "NONE",
    "NO_DRAFTER",
    "NO_PROPOSAL",
    "DraftPlan",
    "DraftRequest",
    "DraftResources",
    "Drafter",
    "DrafterKind",
    "HybridDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "Proposal",
    "SuffixDrafter",
    "SuffixHistory",
    "build_drafter",
    "default_drafter",
    "drafter_names",
    "is_lookup",
    "lookup_source",
]

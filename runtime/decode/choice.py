"""Which K policy and drafter a generation's settings ask for on an artifact, and what -k auto
has learned so far with each drafter (a pipeline's later generations start from it)."""

from __future__ import annotations

import threading

from specx.runtime.artifact.contract import Manifest
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.policy import FixedK, KPolicy
from specx.runtime.drafters import registry
from specx.runtime.errors import InputError
from specx.runtime.settings import AUTO, DEFAULT_K, MAX_K, GenerationSettings


def policy_memory(drafter: str, batched: bool) -> str:
    """Under which name -k auto keeps what it learned: alone and in a batch, drafting and
    verifying cost differently, so the two never start from each other's estimates."""
    return f"{drafter} (batched)" if batched else drafter


class LearnedPolicies:
    """What -k auto generations learned, per drafter (thread-safe)."""

    def __init__(self) -> None:
        self._learned: dict[str, AdaptiveK] = {}
        self._lock = threading.Lock()

    def remember(self, drafter: str, policy: KPolicy, batched: bool = False) -> None:
        if isinstance(policy, AdaptiveK) and policy.history:
            with self._lock:
                self._learned[policy_memory(drafter, batched)] = policy

    def learned(self, name: str) -> AdaptiveK | None:
        with self._lock:
            return self._learned.get(name)

    def forget(self) -> None:
        with self._lock:
            self._learned.clear()


def draft_ratio(manifest: Manifest, drafter: str) -> float | None:
    """The weight bytes a pass of the drafter's model reads over the target's (a draft pass's
    cost until one is measured); None for drafters without a model."""
    inner = registry.split_hybrid(drafter) or drafter
    spec = next((d for d in manifest.drafts if d.name == inner), None)
    target = manifest.target.weight_bytes
    if spec is None or spec.head is not None or not spec.weight_bytes or not target:
        return None
    return spec.weight_bytes / target


def resolve_policy(
    manifest: Manifest, settings: GenerationSettings, learned: LearnedPolicies, batched: bool
) -> tuple[KPolicy, int, str]:
    """(K policy, K to report, drafter name) for these settings on this artifact."""
    names = registry.drafter_names(manifest)
    name = settings.drafter or registry.default_drafter(manifest)
    if name not in names:
        raise InputError(
            f"unknown drafter {name!r}", f"choose one of: {', '.join(names)}", "drafter"
        )
    profile = manifest.profile or {}
    limit = int(profile.get("k_max", MAX_K))
    k = settings.k
    if k is None:
        k = 0 if name == registry.NO_DRAFTER else int(profile.get("k_default", DEFAULT_K))
    if k == AUTO:
        if name == registry.NO_DRAFTER:
            raise InputError("-k auto needs a drafter", "pass --draft NAME (or ngram)", "drafter")
        max_k = min(settings.max_k, limit)
        policy = AdaptiveK(max_k=max_k)
        policy.draft_ratio = draft_ratio(manifest, name)
        policy.lazy_draft = not batched  # alone, the draft reads the prompt when first asked
        previous = learned.learned(policy_memory(name, batched))
        if previous is not None:
            policy.inherit(previous)
        return policy, max_k, name
    assert isinstance(k, int)  # GenerationSettings parsed it
    if k > limit:
        raise InputError(
            f"K={k} exceeds the profile's k_max {limit} (its engines verify at most "
            f"{limit + 1} tokens per pass)",
            f"use -k {limit} or less, or re-export with a profile allowing more",
            "k",
        )
    if k == 0:
        name = registry.NO_DRAFTER
    elif name == registry.NO_DRAFTER:
        raise InputError(
            f"K={k} needs a drafter, and --draft none asks for the target alone",
            "use -k 0 (target alone), or --draft one of: "
            + ", ".join(n for n in names if n != registry.NO_DRAFTER),
            "drafter",
        )
    return FixedK(k), k, name

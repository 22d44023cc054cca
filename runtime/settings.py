"""What one generation is asked to do, as one frozen object.

The API's keyword arguments (``Pipeline.generate(prompt, k=4, temperature=0.7)``) and the CLI's
flags map onto these fields one to one; the runtime passes the object down and never changes a
drafter or a session to configure it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specx.runtime.constraint import Grammar
from specx.runtime.errors import InputError
from specx.runtime.verification.logprobs import check_top
from specx.runtime.verification.sampling import SamplingParams

MAX_K = 16  # the widest verify pass any artifact is asked for is MAX_K + 1 tokens
DEFAULT_K = 4  # K when neither the run nor the artifact's profile says
AUTO = "auto"
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 128
    # draft tokens per step: 0 = the target alone, "auto" = chosen before every step (up to
    # max_k), None = the artifact's default (its profile's k_default, else DEFAULT_K)
    k: int | str | None = None
    max_k: int = 8
    drafter: str | None = None  # a name the artifact offers; None: its default drafter
    draft_p_min: float = 0.0  # a model draft stops proposing below this top probability
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chat: bool = False  # wrap a text prompt in the model's chat template
    system: str | None = None  # the system message of a chat prompt
    grammar: Grammar | None = None  # structured output: every emitted token follows it
    logprobs: int | None = None  # report each token's log-probability and this many alternatives
    # whose earlier prompts this generation may reuse, and whose later ones may reuse it (a
    # tenant, narrowed by a request's cache salt: runtime/prefix); None: neither
    cache_scope: str | None = ""

    def __post_init__(self) -> None:
        if self.logprobs is not None:
            check_top(self.logprobs)
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InputError(
                "grammar must be a specx Grammar", "e.g. Grammar.json_schema(schema)", "grammar"
            )
        if self.cache_scope is not None and not isinstance(self.cache_scope, str):
            raise InputError("cache_scope must be a string or None", field="cache_scope")
        if self.max_new_tokens < 1:
            raise InputError(
                f"max-new-tokens must be >= 1, got {self.max_new_tokens}", field="max_new_tokens"
            )
        if not 0.0 <= self.draft_p_min < 1.0:
            raise InputError(
                f"draft-p-min must be in [0, 1), got {self.draft_p_min}", field="draft_p_min"
            )
        if not 1 <= self.max_k <= MAX_K:
            raise InputError(f"max K must be in 1..{MAX_K}, got {self.max_k}", field="max_k")
        k = self.k
        if isinstance(k, str) and k != AUTO:
            try:
                k = int(k)
            except ValueError as e:
                raise InputError(f"K must be a number or 'auto', got {k!r}", field="k") from e
            object.__setattr__(self, "k", k)
        if isinstance(k, int) and not 0 <= k <= MAX_K:
            raise InputError(
                f"K must be in 0..{MAX_K}, got {k}", "e.g. -k 4, or -k 0 for none", "k"
            )

    @classmethod
    def of(cls, settings: GenerationSettings | None = None, **options: Any) -> GenerationSettings:
        """Settings from keyword options: any field of this class, or a sampling field
        (temperature, top_k, top_p, min_p, seed, verification) as a shortcut; applied on top of
        `settings` if given."""
        base = settings or cls()
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names - set(SAMPLING_FIELDS))
        if unknown:
            raise InputError(
                f"unknown generation option(s) {', '.join(unknown)}",
                f"use {', '.join(sorted(names | set(SAMPLING_FIELDS)))}",
            )
        given = {n: options.pop(n) for n in SAMPLING_FIELDS if n in options}
        shortcuts = {n: v for n, v in given.items() if v is not None}  # None: left as it is
        if shortcuts and "sampling" in options:
            raise InputError("pass either sampling=SamplingParams(...) or the keyword shortcuts")
        sampling = options.pop("sampling", base.sampling)
        if shortcuts:
            sampling = dataclasses.replace(sampling, **shortcuts)
        return dataclasses.replace(base, sampling=sampling, **options)

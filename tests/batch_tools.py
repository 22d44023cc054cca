"""Batching's test helpers, shared by the tests of the batched export (tests/exporter), of runtime
batching (tests/runtime), of `specx serve` and the concurrency bench (tests/apps) and of the
batch diagnostics (tests/scripts): the prompts, a tiny export with a batched graph, and runtime
sequences for batch rows. tests/conftest.py's `batched_llama` exports the llama once per
session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime import Pipeline

PROMPTS = [
    "The cat is sitting on the mat.",
    "def add(a, b):",
    "One, two, three, four, five, six, seven,",
    "A key-value cache stores",
    "Speculative decoding lets a small draft model propose tokens that a large model verifies.",
]


def export_batched(
    root: Path, tokenizer: Any, arch: str, features: dict[str, Any] | None = None
) -> Any:
    """A tiny `arch` target and a close draft ("mixed", with "ngram") exported with a batched
    graph: (artifact, the transformers target)."""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    saved = tiny_models.FEATURES.get(arch)
    if features is not None:
        tiny_models.FEATURES[arch] = features
    try:
        vocab = tokenizer.get_vocab_size()
        target = tiny_models.build_model(arch, vocab, seed=1)
        draft = tiny_models.perturbed_copy(target, 0.02, seed=7)
    finally:
        if saved is not None:
            tiny_models.FEATURES[arch] = saved
    src = tiny_models.save(target, tokenizer, root / f"{arch}-target")
    dsrc = tiny_models.save(draft, tokenizer, root / f"{arch}-draft")
    artifact = root / f"{arch}-artifact"
    export_pair(
        str(src),
        [f"mixed={dsrc}", "ngram"],
        artifact,
        ExportOptions(max_length=128, batched=True),
        log=lambda _m: None,
    )
    return artifact, target


def prompt_ids(pipe: Pipeline, prompt: str) -> np.ndarray:
    return pipe.encode_prompt(prompt)


def row_sequence(
    pipe: Pipeline,
    ids: np.ndarray,
    settings: Any,
    policy: Any = None,
    drafter: Any = None,
    emit: Any = None,
    eos: Any = None,
) -> Any:
    """A sequence for a batch row (FixedK(0), no drafter, the artifact's end tokens unless
    told otherwise)."""
    from specx.runtime.decode.policy import FixedK
    from specx.runtime.decode.sequence import Sequence
    from specx.runtime.decode.stats import Stats

    vocab = pipe.manifest.target.vocab_size
    ends = pipe.manifest.special_tokens.eos_token_ids if eos is None else eos
    policy = FixedK(0) if policy is None else policy
    return Sequence(ids, settings, policy, drafter, Stats(), vocab, frozenset(ends), emit=emit)


def pipe_settings(**options: Any) -> Any:
    from specx.runtime.settings import GenerationSettings

    return GenerationSettings.of(None, **options)

"""specx runtime: speculative decoding with numpy + onnxruntime + tokenizers (no torch).

The core imports nothing outside this package (tests/runtime/test_layers.py checks it)."""

from specx.runtime.constraint import Grammar
from specx.runtime.decode.stats import Stats
from specx.runtime.errors import ArtifactError, ExportError, InputError, SpecxError
from specx.runtime.pipeline import Pipeline
from specx.runtime.result import GenerationResult
from specx.runtime.settings import GenerationSettings
from specx.runtime.verification.logprobs import TokenLogprob
from specx.runtime.verification.sampling import SamplingParams

__all__ = [
    "ArtifactError",
    "ExportError",
    "GenerationResult",
    "GenerationSettings",
    "Grammar",
    "InputError",
    "Pipeline",
    "SamplingParams",
    "SpecxError",
    "Stats",
    "TokenLogprob",
]

"""specx runtime: speculative decoding with numpy + onnxruntime + tokenizers (no torch)."""

from specx.runtime.errors import ArtifactError, ExportError, InputError, SpecxError
from specx.runtime.pipeline import GenerationResult, Pipeline
from specx.runtime.sampling import SamplingParams
from specx.runtime.stats import Stats

__all__ = [
    "ArtifactError",
    "ExportError",
    "GenerationResult",
    "InputError",
    "Pipeline",
    "SamplingParams",
    "SpecxError",
    "Stats",
]

"""Decoder folders made by ONNX Runtime GenAI's model builder, the real tool
(`python -m onnxruntime_genai.models.builder`), on tiny random models: what `specx import` is
tested on beside Optimum's folders (tests/optimum_models.py).

The builder runs in its own environment (scripts/setup_genai.sh env; scripts/test.sh exports
SPECX_GENAI_PYTHON); without it these tests skip and say why. The Hugging Face folder it reads
is the tests' own tiny model (tiny_models.py), saved by this environment's transformers.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

GENAI_PYTHON = os.environ.get("SPECX_GENAI_PYTHON", "")
needs_genai = pytest.mark.skipif(
    not GENAI_PYTHON,
    reason="SPECX_GENAI_PYTHON is not set (scripts/test.sh sets it: scripts/setup_genai.sh env)",
)


def genai_folder(
    root: Path, seed: int = 0, noise: float = 0.0, precision: str = "fp32", family: str = "llama"
) -> Path:
    """GenAI's build of a tiny model of `family` (4 heads over 2 kv heads, head size 16) under
    root; noise: a perturbed copy of the seed's model (a draft that agrees often, not always)."""
    from tiny_models import build_model, build_tokenizer, perturbed_copy, save

    name = f"{family}-{seed}-{noise}-{precision}"
    source, out = root / f"{name}-hf", root / name
    tokenizer = build_tokenizer()
    model = build_model(family, tokenizer.get_vocab_size(), seed)
    if noise:
        model = perturbed_copy(model, noise, seed + 1)
    save(model, tokenizer, source)
    cache = root / f"{name}-cache"
    build = [GENAI_PYTHON, "-m", "onnxruntime_genai.models.builder", "-i", str(source),
             "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(cache)]  # fmt: skip
    offline = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(build, capture_output=True, text=True, timeout=600, env=offline)
    assert done.returncode == 0, done.stderr[-3000:]
    return out

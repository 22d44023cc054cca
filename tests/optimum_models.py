"""Decoder folders made by Hugging Face Optimum's exporter, the real tool (`optimum-cli export
onnx`), on tiny random models: what `specx import` is tested on.

Optimum (optimum-onnx 0.1) pins transformers 4.57, so it runs in its own environment
(scripts/setup_optimum.sh; scripts/test.sh exports SPECX_OPTIMUM_PYTHON); without it these
tests skip and say why. The model is built inside that environment (its transformers writes the
config Optimum reads); the tokenizer is the tests' own (tiny_models.build_tokenizer), copied
beside the graph as an onnx-community folder has it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

OPTIMUM_PYTHON = os.environ.get("SPECX_OPTIMUM_PYTHON", "")
needs_optimum = pytest.mark.skipif(
    not OPTIMUM_PYTHON,
    reason="SPECX_OPTIMUM_PYTHON is not set (scripts/test.sh sets it: scripts/setup_optimum.sh)",
)

# Run in Optimum's environment: a tiny random model of a family (4 heads over 2 kv heads: GQA),
# optionally with noise on every weight (a draft that agrees often, not always), saved.
MAKE = """
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
family, out, seed, noise = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(seed)
config = AutoConfig.for_model(
    family, vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)
model = AutoModelForCausalLM.from_config(config).eval()
with torch.no_grad():
    g = torch.Generator().manual_seed(seed + 1000)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp(min=1e-3))
model.save_pretrained(out)
"""


def optimum_folder(
    root: Path,
    family: str,
    seed: int = 0,
    noise: float = 0.0,
    past: bool = True,
    task: str | None = None,
) -> Path:
    """An Optimum export of a tiny `family` model under root, with the tests' tokenizer beside it.
    past=False: the cache-less graph of `--task text-generation`; `task`: another task's."""
    from tiny_models import build_tokenizer, hf_tokenizer

    task = task or ("text-generation-with-past" if past else "text-generation")
    name = f"{family}-{seed}-{noise}-{task}"
    source, out = root / f"{name}-hf", root / name
    hf_tokenizer(build_tokenizer()).save_pretrained(source)
    make = [OPTIMUM_PYTHON, "-c", MAKE, family, str(source), str(seed), str(noise)]
    subprocess.run(make, check=True, capture_output=True, timeout=300)
    cli = Path(OPTIMUM_PYTHON).parent / "optimum-cli"
    export = [str(cli), "export", "onnx", "--model", str(source), "--task", task, str(out)]
    done = subprocess.run(export, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / f).is_file() and not (out / f).is_file():
            shutil.copy2(source / f, out / f)
    return out

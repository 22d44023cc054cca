"""`specx import` on a real model: SmolLM2-135M exported by Hugging Face Optimum (the real tool,
in its own environment), run speculatively by specx, against transformers' own greedy decoding.

Runs when SPECX_SMOLLM2_GGUF and SPECX_OPTIMUM_PYTHON are set (scripts/test.sh sets both); the
GGUF file becomes a Hugging Face folder (scripts/gguf_to_hf.py), which Optimum exports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optimum_models import OPTIMUM_PYTHON
from scratch import fixture_dir

from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline

GGUF = os.environ.get("SPECX_SMOLLM2_GGUF", "")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(GGUF).is_file(), reason="SPECX_SMOLLM2_GGUF is not set"),
    pytest.mark.skipif(not OPTIMUM_PYTHON, reason="SPECX_OPTIMUM_PYTHON is not set"),
]


@pytest.fixture(scope="module")
def folders(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Hugging Face folder, Optimum's export of it with the tokenizer beside the graph)."""
    root = fixture_dir(request, tmp_path_factory, "smollm2-optimum")
    hf, onnx = root / "hf", root / "onnx"
    convert = [sys.executable, str(ROOT / "scripts" / "gguf_to_hf.py"), GGUF, str(hf)]
    subprocess.run(convert, check=True, capture_output=True, timeout=900)
    cli = Path(OPTIMUM_PYTHON).parent / "optimum-cli"
    export = [str(cli), "export", "onnx", "--model", str(hf), "--task",
              "text-generation-with-past", str(onnx)]  # fmt: skip
    done = subprocess.run(export, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (hf / f).is_file():
            shutil.copy2(hf / f, onnx / f)
    return hf, onnx


def test_an_optimum_smollm2_decodes_speculatively_as_transformers_does(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from reference import assert_same_or_near_tie, hf_greedy

    hf, onnx = folders
    manifest = import_pair(onnx, ["suffix", "ngram"], tmp_path / "art", ImportOptions(), print)
    assert manifest.target.num_layers == 30 and manifest.chat_template
    assert manifest.target.parity["argmax_agreement"] == 1.0
    pipe = Pipeline.load(tmp_path / "art")
    prompt = pipe.encode_prompt("Write a Python function that tells if n is prime.", chat=True)
    alone = pipe.generate(prompt, max_new_tokens=64, k=0)
    for drafter, k in (("suffix", "auto"), ("ngram", 4)):
        result = pipe.generate(prompt, max_new_tokens=64, k=k, drafter=drafter)
        assert result.token_ids == alone.token_ids, drafter
    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    eos = pipe.manifest.special_tokens.eos_token_ids
    want = hf_greedy(model, np.asarray(prompt), len(alone.token_ids), eos)
    assert_same_or_near_tie(model, np.asarray(prompt), alone.token_ids, want)


def test_a_rewritten_optimum_smollm2_gives_the_unrewritten_graphs_text(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    """--rewrite gqa on the real model: every layer found, the text of the graph as exported."""
    _, onnx = folders
    plain = import_pair(onnx, ["suffix"], tmp_path / "plain", ImportOptions(), print)
    rewritten = import_pair(onnx, ["suffix"], tmp_path / "gqa", ImportOptions(rewrite="gqa"), print)
    assert plain.target.attention == "concat" and rewritten.target.attention == "gqa"
    assert rewritten.target.parity["rewrite"]["argmax_agreement"] == 1.0
    prompts = []
    for folder in (tmp_path / "plain", tmp_path / "gqa"):
        pipe = Pipeline.load(folder)
        prompt = pipe.encode_prompt("Write a Python function that reverses a list.", chat=True)
        alone = pipe.generate(prompt, max_new_tokens=64, k=0).token_ids
        assert (
            pipe.generate(prompt, max_new_tokens=64, k="auto", drafter="suffix").token_ids == alone
        )
        prompts.append(alone)
    assert prompts[0] == prompts[1]

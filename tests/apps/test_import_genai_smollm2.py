"""`specx import` on a real model built by ONNX Runtime GenAI's builder: SmolLM2-135M as an fp32
target with its int4 draft (scripts/setup_genai.sh smollm2, the same pair `specx bench --peers
genai` runs), decoded speculatively by specx, against transformers' own greedy decoding.

Runs when SPECX_SMOLLM2_GGUF and SPECX_GENAI_PYTHON are set (scripts/test.sh sets both); the
pair is built once into the specx cache and kept.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from genai_models import GENAI_PYTHON

from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline

GGUF = os.environ.get("SPECX_SMOLLM2_GGUF", "")
ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECX_CACHE", Path.home() / ".cache" / "specx"))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(GGUF).is_file(), reason="SPECX_SMOLLM2_GGUF is not set"),
    pytest.mark.skipif(not GENAI_PYTHON, reason="SPECX_GENAI_PYTHON is not set"),
]


@pytest.fixture(scope="module")
def pair_folder() -> Path:
    """GenAI's build of SmolLM2 (target-fp32/, draft-int4/), made once by the setup script."""
    env = {**os.environ, "SPECX_GENAI_VENV": str(Path(GENAI_PYTHON).parents[1])}
    setup = ["bash", str(ROOT / "scripts" / "setup_genai.sh"), "smollm2"]
    done = subprocess.run(setup, capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def test_genai_s_smollm2_pair_decodes_speculatively_as_transformers_does(
    pair_folder: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from reference import assert_same_or_near_tie, hf_greedy

    drafts = [str(pair_folder / "draft-int4"), "suffix"]
    manifest = import_pair(
        pair_folder / "target-fp32", drafts, tmp_path / "art", ImportOptions(), print
    )
    assert manifest.target.attention == manifest.drafts[0].attention == "genai"
    assert manifest.target.parity["argmax_agreement"] == 1.0
    pipe = Pipeline.load(tmp_path / "art")
    prompt = pipe.encode_prompt("Write a Python function that tells if n is prime.", chat=True)
    alone = pipe.generate(prompt, max_new_tokens=64, k=0)
    for drafter, k in (("draft", 3), ("draft", "auto"), ("suffix", "auto")):
        result = pipe.generate(prompt, max_new_tokens=64, k=k, drafter=drafter)
        assert result.token_ids == alone.token_ids, (drafter, k)
    drafted = pipe.generate(prompt, max_new_tokens=64, k=3, drafter="draft").stats
    assert drafted.accepted > drafted.proposed // 3  # the int4 build of the same model agrees
    torch.set_num_threads(os.cpu_count() or 1)
    hf = CACHE / "hf" / Path(GGUF).stem  # the folder the setup script built the pair from
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    eos = pipe.manifest.special_tokens.eos_token_ids
    want = hf_greedy(model, np.asarray(prompt), len(alone.token_ids), eos)
    assert_same_or_near_tie(model, np.asarray(prompt), alone.token_ids, want)

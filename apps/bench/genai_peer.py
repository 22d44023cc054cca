"""ONNX Runtime GenAI as a benchmark peer, run in its own virtual environment.

onnxruntime-genai brings its own onnxruntime, so it cannot share specx's environment. The bench
writes the prompt token ids to a file and runs ``genai_runner.py`` (shipped beside this module,
importing nothing from specx) with that environment's python, once for the target alone and once
per K with the draft. Models are built by GenAI's own builder (scripts/setup_genai.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_PYTHON = Path(".venv-genai/bin/python")


def _find(cfg: Any) -> tuple[Path | None, Path | None, str]:
    python = cfg.genai_python or os.environ.get("SPECX_GENAI_PYTHON")
    python_path = Path(python) if python else DEFAULT_PYTHON
    models = cfg.genai_models or os.environ.get("SPECX_GENAI_MODELS")
    if not python_path.is_file():
        return None, None, f"no onnxruntime-genai python at {python_path} (scripts/setup_genai.sh)"
    if not models or not (Path(models) / "target-fp32").is_dir():
        return None, None, "no GenAI models (set SPECX_GENAI_MODELS to scripts/setup_genai.sh's)"
    return python_path, Path(models), ""


def genai_peer(cfg: Any, prompts: list[np.ndarray], progress: Any) -> dict[str, Any]:
    python, models, why = _find(cfg)
    if python is None or models is None:
        return {"skipped": why}
    runner = resources.files("specx.apps.bench").joinpath("data/genai_runner.py")
    out: dict[str, Any] = {"models": str(models)}
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompts.json"
        prompt_file.write_text(json.dumps([p.tolist() for p in prompts]))
        variants: list[tuple[str, list[str]]] = [("target", [])]
        draft = models / "draft-int4"
        if draft.is_dir():
            variants += [
                (f"int4 K={k}", ["--draft", str(draft), "--k", str(k)])
                for k in sorted({2, cfg.sampling_k, 4})
            ]
        for name, extra in variants:
            progress(f"peer genai {name}")
            cmd = [
                str(python),
                str(runner),
                "--target",
                str(models / "target-fp32"),
                "--prompts",
                str(prompt_file),
                "--max-new-tokens",
                str(cfg.max_new_tokens),
                "--repeats",
                str(cfg.repeats),
                *extra,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            if proc.returncode != 0:
                out[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            data = json.loads(proc.stdout)
            out[name] = {
                "tokens_per_s": data["median_tokens_per_s"],
                "speculative": data.get("speculative"),
                "version": data.get("version"),
            }
    return out

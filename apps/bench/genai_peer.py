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
DEFAULT_MODELS = Path.home() / ".cache/specx/genai"


def model_folders(models: Path) -> tuple[Path, Path | None]:
    """The GenAI target folder (the one `target-*` beside its `draft-int4`) of a built pair."""
    targets = sorted(p for p in models.glob("target-*") if (p / "genai_config.json").is_file())
    if len(targets) != 1:
        found = [p.name for p in targets] or "none"
        raise ValueError(f"{models}: expected one built target-* folder, found {found}")
    draft = models / "draft-int4"
    return targets[0], draft if (draft / "genai_config.json").is_file() else None


def pair_for(target_source: str, root: Path | None = None) -> Path | None:
    """The pair under `root` that scripts/setup_genai.sh built from the artifact's own target
    GGUF (its source.json names it), so both engines run the same weights."""
    want = os.path.realpath(target_source)
    for source in sorted((root or DEFAULT_MODELS).glob("*/source.json")):
        try:
            if json.loads(source.read_text()).get("target") == want:
                return source.parent
        except (OSError, json.JSONDecodeError):
            continue
    return None


def _find(cfg: Any, target_source: str) -> tuple[Path | None, Path | None, str]:
    python = cfg.genai_python or os.environ.get("SPECX_GENAI_PYTHON")
    python_path = Path(python) if python else DEFAULT_PYTHON
    if not python_path.is_file():
        return None, None, f"no onnxruntime-genai python at {python_path} (scripts/setup_genai.sh)"
    given = cfg.genai_models or os.environ.get("SPECX_GENAI_MODELS")
    models = Path(given) if given else pair_for(target_source)
    if models is None:
        return (
            None,
            None,
            (
                f"no GenAI pair built from {target_source} (scripts/setup_genai.sh MODEL, "
                "or --genai-models)"
            ),
        )
    return python_path, models, ""


def genai_peer(
    cfg: Any, target_source: str, prompts: list[np.ndarray], progress: Any
) -> dict[str, Any]:
    """GenAI's target alone, then with its int4 draft for each of the bench's K."""
    python, models, why = _find(cfg, target_source)
    if python is None or models is None:
        return {"skipped": why}
    try:
        target, draft = model_folders(models)
    except ValueError as e:
        return {"skipped": str(e)}
    runner = resources.files("specx.apps.bench").joinpath("data/genai_runner.py")
    out: dict[str, Any] = {"models": str(models), "target_folder": target.name}
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompts.json"
        prompt_file.write_text(json.dumps([p.tolist() for p in prompts]))
        variants: list[tuple[str, list[str]]] = [("target", [])]
        if draft is not None:
            variants += [
                (f"int4 K={k}", ["--draft", str(draft), "--k", str(k)]) for k in sorted(cfg.ks)
            ]
        for name, extra in variants:
            progress(f"peer genai {name}")
            cmd = [
                str(python),
                str(runner),
                "--target",
                str(target),
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
                "acceptance": (data.get("speculative_stats") or {}).get("acceptance_rate"),
            }
    return out

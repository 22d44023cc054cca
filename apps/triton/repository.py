"""`specx triton ARTIFACT -o REPOSITORY`: a Triton Inference Server model repository that serves
an artifact through the Python backend (model.py beside this file), decoupled so tokens stream.

    REPOSITORY/NAME/config.pbtxt     inputs and outputs named like the vLLM/TensorRT-LLM backends
    REPOSITORY/NAME/1/model.py       loads the artifact with specx's runtime

The config records where the artifact is, the Python environment specx runs from (its site
directories, added by the model at start-up) and that environment's Python version, which the
backend stub must match. The repository is written beside its destination and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specx.runtime import InputError
from specx.runtime.artifact.contract import Manifest

INPUTS = (
    ("text_input", "TYPE_STRING", False),
    ("stream", "TYPE_BOOL", True),
    ("max_tokens", "TYPE_INT32", True),
    ("temperature", "TYPE_FP32", True),
    ("top_p", "TYPE_FP32", True),
    ("min_p", "TYPE_FP32", True),
    ("top_k", "TYPE_INT32", True),
    ("seed", "TYPE_UINT64", True),
    ("sampling_parameters", "TYPE_STRING", True),
    ("exclude_input_in_output", "TYPE_BOOL", True),
    ("k", "TYPE_STRING", True),
    ("drafter", "TYPE_STRING", True),
    ("chat", "TYPE_BOOL", True),
)
OUTPUTS = (("text_output", "TYPE_STRING"), ("specx_stats", "TYPE_STRING"))


PROBE = (
    "import json, site, sys, sysconfig\n"
    "paths = [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]\n"
    "version = f'{sys.version_info[0]}.{sys.version_info[1]}'\n"
    "print(json.dumps({'paths': paths + site.getsitepackages(), 'version': version, "
    "'prefix': sys.prefix}))\n"
)


@dataclass(frozen=True)
class PythonEnvironment:
    """Where the Python backend finds specx and its dependencies."""

    site_packages: tuple[str, ...]
    version: str  # "3.11": the backend stub must be built for the same version
    prefix: str  # the environment's root (its bin/ goes first on the server's PATH)


def python_environment(python: str | None = None) -> PythonEnvironment:
    """The environment of `python` (default: the one running now)."""
    if python is None:
        paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        out: dict[str, Any] = {
            "paths": paths + site.getsitepackages(),
            "version": version,
            "prefix": sys.prefix,
        }
    else:
        try:
            proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=60)
        except OSError as e:
            raise InputError(f"cannot run {python}: {e.strerror}") from e
        if proc.returncode:
            raise InputError(f"{python} failed: {proc.stderr.strip()[-300:]}")
        out = json.loads(proc.stdout)
    found = tuple(dict.fromkeys(p for p in out["paths"] if Path(p).is_dir()))
    return PythonEnvironment(found, str(out["version"]), str(out["prefix"]))


def config_text(
    name: str,
    artifact: Path,
    instances: int,
    threads: int | None,
    env: PythonEnvironment,
    batch: int = 0,
    batch_context: int | None = None,
) -> str:
    inputs = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: [ 1 ]{" optional: true" if o else ""} }}'
        for n, t, o in INPUTS
    )
    outputs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: [ -1 ] }}' for n, t in OUTPUTS)
    parameters = {
        "artifact": str(artifact),
        "site_packages": ":".join(env.site_packages),
        "python_version": env.version,
        "threads": str(threads or 0),
        "max_batch": str(batch),
        "batch_context": str(batch_context or 0),
    }
    params = "\n".join(
        f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
        for k, v in parameters.items()
    )
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n{params}\n"
    )


def write_repository(
    artifact: Path,
    output: Path,
    name: str = "specx",
    instances: int = 1,
    threads: int | None = None,
    force: bool = False,
    python: str | None = None,
    batch: int = 0,
    batch_context: int | None = None,
) -> Path:
    """Write the repository; returns the model's folder. `python`: the interpreter whose
    environment the backend runs specx in (default: this one). `batch` > 0: requests share
    target passes, up to `batch` sequences each (rows of `batch_context` positions)."""
    env = python_environment(python)
    artifact = artifact.resolve()
    manifest = Manifest.read(artifact)  # refuse what could not be served, now, not in Triton
    if not 0 <= batch <= 256:
        raise InputError(f"--batch must be in 0..256, got {batch}")
    if batch and manifest.batched is None:
        raise InputError(
            "--batch needs an artifact with a batched graph", "re-export with --batched"
        )
    if batch_context is not None and not 2 <= batch_context <= manifest.max_length:
        raise InputError(
            f"--batch-context must be in 2..{manifest.max_length}, got {batch_context}"
        )
    if not name.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"model name {name!r} must be letters, digits, - and _")
    if instances < 1:
        raise InputError(f"--instances must be >= 1, got {instances}")
    if output.exists() and not force:
        raise InputError(f"{output} already exists", "pass --force to replace it")
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        os.chmod(staged, 0o755)
        model = staged / name
        (model / "1").mkdir(parents=True)
        config = config_text(name, artifact, instances, threads, env, batch, batch_context)
        (model / "config.pbtxt").write_text(config)
        source = resources.files("specx.apps.triton").joinpath("model.py")
        (model / "1" / "model.py").write_text(source.read_text("utf-8"))
        if output.exists():
            shutil.rmtree(output)
        os.replace(staged, output)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return output / name

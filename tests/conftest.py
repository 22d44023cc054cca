"""Shared fixtures: tiny models exported once per session, per architecture."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest_plugins = ["scratch", "pytester"]  # scratch: big fixtures' folders go once unused
# In-process CLI tests (click's CliRunner) must not switch this test process to onnxruntime's
# global thread pool: raw onnxruntime sessions in other tests would then be refused. Subprocess
# tests drop this variable and exercise the CLI's default (global pool).
os.environ["SPECX_THREAD_POOL"] = "session"

HAS_EXPORTER = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "onnx"))
needs_exporter = pytest.mark.skipif(not HAS_EXPORTER, reason="needs specx[export]")


def load_script(name: str) -> Any:
    """A diagnostic of scripts/diagnostics/ (not a package) loaded as a module, for tests of its
    functions."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "diagnostics" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_target_alone(source: Path, out: Path, **options: Any) -> Any:
    """`source` exported with no draft at a 64-token context and `options`: its manifest."""
    from specx.exporter import ExportOptions, export_pair

    return export_pair(
        str(source), [], out, ExportOptions(max_length=64, **options), log=lambda _m: None
    )


def smollm2_gguf() -> Path | None:
    """SmolLM2's GGUF file where the test command fetched it (SPECX_SMOLLM2_GGUF)."""
    path = Path(os.environ.get("SPECX_SMOLLM2_GGUF", "") or "/nonexistent")
    return path if path.is_file() else None


def qwen_sources() -> tuple[str, str, str] | None:
    """(target GGUF, draft GGUF, a reusable export or "") of the Qwen pair, where the test command
    fetched it and SPECX_SKIP_QWEN is unset."""
    target = os.environ.get("SPECX_QWEN_TARGET", "")
    draft = os.environ.get("SPECX_QWEN_DRAFT", "")
    reuse = os.environ.get("SPECX_QWEN_ARTIFACT", "")
    if os.environ.get("SPECX_SKIP_QWEN"):
        return None
    if not (Path(reuse, "manifest.json").is_file() or Path(target).is_file()):
        return None
    return target, draft, reuse


@pytest.fixture(scope="session")
def smollm2_artifact(request: Any, tmp_path_factory: Any) -> Path:
    """SmolLM2 exported with its int8 draft and n-gram lookup, once per test session."""
    from scratch import fixture_dir

    from specx.exporter import ExportOptions, export_pair

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("SPECX_SMOLLM2_GGUF is not set")
    out = fixture_dir(request, tmp_path_factory, "smollm2") / "artifact"
    export_pair(str(gguf), ["int8", "ngram"], out, ExportOptions(max_length=512), log=print)
    return out


@pytest.fixture(scope="session")
def qwen_artifact(request: Any, tmp_path_factory: Any) -> Path:
    """The Qwen pair exported int4 (the 0.5B drafting for the 1.5B), once per test session."""
    from scratch import fixture_dir

    from specx.exporter import ExportOptions, export_pair

    sources = qwen_sources()
    if sources is None:
        pytest.skip("SPECX_SKIP_QWEN is set, or no Qwen pair (SPECX_QWEN_TARGET/DRAFT)")
    target, draft, reuse = sources
    if reuse:
        return Path(reuse)
    out = fixture_dir(request, tmp_path_factory, "qwen") / "artifact"
    export_pair(target, [draft], out, ExportOptions(max_length=1024, precision="int4"), log=print)
    return out


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    import onnxruntime as ort

    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    has_trt = importlib.util.find_spec("tensorrt") is not None and has_cuda
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="no CUDA execution provider here"))
        if "tensorrt" in item.keywords and not has_trt:
            item.add_marker(pytest.mark.skip(reason="no TensorRT here"))


@dataclass
class TinyPair:
    """An exported artifact plus the source models it came from."""

    artifact: Path
    target: Any  # the transformers model (reference for equality tests)
    sources: dict[str, Path]  # name -> saved HF folder
    arch: str
    max_length: int


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    import tiny_models

    return tiny_models.build_tokenizer()


def _export_tiny(
    root: Path,
    tokenizer: Any,
    arch: str,
    max_length: int = 128,
    target_extra_rows: int = 0,
    attention: str = "auto",
) -> TinyPair:
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    vocab = tokenizer.get_vocab_size()
    target = tiny_models.build_model(arch, vocab + target_extra_rows, seed=1)
    mixed = tiny_models.build_model(arch, vocab + target_extra_rows, seed=1)
    mixed.load_state_dict(tiny_models.perturbed_copy(target, 0.02, seed=7).state_dict())
    other = tiny_models.build_model(arch, vocab, seed=2)
    sources = {
        "target": tiny_models.save(target, tokenizer, root / f"{arch}-target"),
        "mixed": tiny_models.save(mixed, tokenizer, root / f"{arch}-mixed"),
        "other": tiny_models.save(other, tokenizer, root / f"{arch}-other"),
    }
    artifact = root / f"{arch}-artifact"
    export_pair(
        str(sources["target"]),
        [f"mixed={sources['mixed']}", f"other={sources['other']}", str(sources["target"])],
        artifact,
        ExportOptions(max_length=max_length, check_k=4, attention=attention),
        log=lambda _m: None,
    )
    return TinyPair(artifact, target, sources, arch, max_length)


@pytest.fixture(scope="session")
def llama_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    return _export_tiny(tmp_path_factory.mktemp("llama"), tokenizer, "llama")


@pytest.fixture(scope="session")
def llama_plain_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    """The llama pair with plain-ONNX attention (the TensorRT graph), run by ONNX Runtime."""
    return _export_tiny(
        tmp_path_factory.mktemp("llamaplain"), tokenizer, "llama", attention="plain"
    )


@pytest.fixture(scope="session")
def gpt2_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    """GPT-2 with plain attention (the other architectures default to gqa)."""
    return _export_tiny(tmp_path_factory.mktemp("gpt2"), tokenizer, "gpt2", attention="plain")


@pytest.fixture(scope="session")
def gpt2_gqa_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    return _export_tiny(tmp_path_factory.mktemp("gpt2gqa"), tokenizer, "gpt2", attention="gqa")


@pytest.fixture(scope="session")
def qwen2_padded_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    """Qwen2 whose target has 16 padding rows beyond the tokenizer (the draft 'other' has none)."""
    return _export_tiny(tmp_path_factory.mktemp("qwen2"), tokenizer, "qwen2", target_extra_rows=16)


@pytest.fixture(scope="session")
def mistral_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    return _export_tiny(tmp_path_factory.mktemp("mistral"), tokenizer, "mistral")


@pytest.fixture(scope="session")
def batched_llama(tmp_path_factory: Any, tokenizer: Any) -> Any:
    """The tiny llama exported with a batched graph, drafts "mixed" and "ngram"
    (tests/batch_tools.py): (artifact, the transformers target), for the batching tests of
    every folder."""
    from batch_tools import export_batched

    return export_batched(tmp_path_factory.mktemp("batched"), tokenizer, "llama")


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory: Any) -> TinyPair:
    """Target and a related draft over 12 tokens, with flat enough distributions to sample."""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("smallvocab")
    tok = tiny_models.build_small_vocab_tokenizer()
    vocab = tok.get_vocab_size()
    target = tiny_models.build_model("llama", vocab, seed=11, init_range=0.06)
    draft = tiny_models.perturbed_copy(target, 0.6, seed=12)
    sources = {
        "target": tiny_models.save(target, tok, root / "target"),
        "draft": tiny_models.save(draft, tok, root / "draft"),
    }
    artifact = root / "artifact"
    export_pair(
        str(sources["target"]),
        [str(sources["draft"])],
        artifact,
        ExportOptions(max_length=64, check_k=4),
        log=lambda _m: None,
    )
    return TinyPair(artifact, target, sources, "llama", 64)


@pytest.fixture(scope="session")
def fp16_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    """A tiny llama exported with an fp16 profile (gpu-datacenter shapes, smaller context)."""
    import tiny_models
    from profile_tools import mutated, to_toml
    from specx.exporter import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("fp16")
    target = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1, max_positions=512)
    mixed = tiny_models.perturbed_copy(target, 0.02, seed=7)
    sources = {
        "target": tiny_models.save(target, tokenizer, root / "t"),
        "mixed": tiny_models.save(mixed, tokenizer, root / "d"),
    }
    data = mutated("gpu-datacenter", lambda d: None)
    data.update(max_context=256, prefill_chunk=64)
    data["tensorrt"]["prefill"].update(seq=[1, 64, 64], past_len=[0, 0, 192])
    data["tensorrt"]["decode"].update(past_len=[0, 64, 247])
    profile = root / "gpu-small.toml"
    profile.write_text(to_toml(data))
    export_pair(
        str(sources["target"]),
        [f"mixed={sources['mixed']}"],
        root / "artifact",
        ExportOptions(profile=str(profile)),
        log=lambda _m: None,
    )
    return TinyPair(root / "artifact", target, sources, "llama", 256)


@pytest.fixture(scope="session")
def long_pair(tmp_path_factory: Any, tokenizer: Any) -> TinyPair:
    """A tiny llama with a 2048-token cache, for long runs."""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("long")
    target = tiny_models.build_model(
        "llama", tokenizer.get_vocab_size(), seed=21, max_positions=4096
    )
    mixed = tiny_models.perturbed_copy(target, 0.02, seed=22)
    sources = {
        "target": tiny_models.save(target, tokenizer, root / "target"),
        "mixed": tiny_models.save(mixed, tokenizer, root / "mixed"),
    }
    export_pair(
        str(sources["target"]),
        [f"mixed={sources['mixed']}"],
        root / "artifact",
        ExportOptions(max_length=2048),
        log=lambda _m: None,
    )
    # A random model emits EOS now and then; a long run must not stop there, so this artifact
    # declares no EOS token (the runtime then stops only at the cache limit).
    manifest = root / "artifact" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["special_tokens"]["eos_token_ids"] = []
    manifest.write_text(json.dumps(data))
    return TinyPair(root / "artifact", target, sources, "llama", 2048)


@pytest.fixture(scope="session")
def distilled(tmp_path_factory: Any, tokenizer: Any) -> dict[str, Any]:
    """A feature head `specx distill` trained on a tiny llama's own answers, exported with its
    target: for tests/exporter/test_distill.py and the head_acceptance diagnostic's test."""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair
    from specx.exporter.heads.distill.run import DistillOptions, distill

    root = tmp_path_factory.mktemp("distill")
    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1, layers=6)
    source = tiny_models.save(model, tokenizer, root / "target")
    options = DistillOptions(
        max_prompts=40,
        self_prompts=6,
        max_new_tokens=32,
        grounded=8,
        draft_vocab=160,
        # bounded by epochs, not by time, so that a slow machine trains the same head (150
        # epochs: 0.62 of its drafts accepted on its training prompts; 100: 0.46, 40: 0.11); the
        # time budget is a cap it does not reach (about 50 s here)
        train_minutes=10.0,
        max_epochs=150,
        generate_batch=16,
    )
    logs: list[str] = []
    report = distill(str(source), root / "head", options, log=logs.append)
    artifact = root / "artifact"
    export_pair(
        str(source),
        [f"eagle={root / 'head'}", "ngram"],
        artifact,
        ExportOptions(max_length=256),
        log=lambda _m: None,
    )
    return {
        "model": model,
        "source": source,
        "head": root / "head",
        "report": report,
        "artifact": artifact,
        "options": options,
        "logs": logs,
    }


@pytest.fixture
def cheap_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    """-k auto assumes a draft pass costs what its weights say (choice.draft_ratio) until it
    is measured; the tiny pairs' drafts are as large as their targets, so it would never ask
    them. Tests of what -k auto does while drafting pretend they are twenty times smaller, as
    real pairs' drafts are several times smaller."""
    from specx.runtime.decode import choice

    monkeypatch.setattr(choice, "draft_ratio", lambda manifest, drafter: 0.05)


@pytest.fixture(scope="session")
def optimum_folders(tmp_path_factory: Any) -> dict[str, Path]:
    """Folders made by Optimum's exporter (tests/optimum_models.py), once per session: a tiny
    llama target, a noisy copy of it as its draft, a qwen2 (q/k/v biases)."""
    from optimum_models import optimum_folder

    root = tmp_path_factory.mktemp("optimum")
    return {
        "target": optimum_folder(root, "llama", seed=0),
        "draft": optimum_folder(root, "llama", seed=0, noise=0.6),  # agrees often, not always
        "qwen2": optimum_folder(root, "qwen2", seed=3),
    }

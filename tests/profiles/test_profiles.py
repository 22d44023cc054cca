"""Deployment profiles, the memory planner, fp16 graphs and TensorRT readiness (CPU-checkable)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from profile_tools import mutated, to_toml
from specx.profiles import ProfileError, builtin_names, load_profile, parse_profile
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest
from specx.runtime.errors import ExportError, ProviderError

REQUIRED = {"cpu", "gpu-datacenter", "jetson-orin-nano-8gb", "jetson-agx-orin-64gb"}


def test_the_builtin_profiles_exist_and_validate() -> None:
    assert set(builtin_names()) >= REQUIRED
    for name in builtin_names():
        profile = load_profile(name)
        assert profile.name == name
        if profile.tensorrt.enabled:
            assert profile.tensorrt.decode is not None
            assert profile.tensorrt.decode.seq.max >= profile.k_max + 1


def test_every_field_of_the_builtin_profiles_is_commented() -> None:
    import importlib.resources as resources

    for name in builtin_names():
        text = resources.files("specx.profiles").joinpath(f"{name}.toml").read_text()
        fields = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
        documented = {f.split("=")[0].strip() for f in fields if "#" in f}
        # every field is commented here or in the cpu profile that introduces it
        base = resources.files("specx.profiles").joinpath("cpu.toml").read_text()
        base_documented = {
            line.split("=")[0].strip() for line in base.splitlines() if "=" in line and "#" in line
        }
        trt = resources.files("specx.profiles").joinpath("gpu-datacenter.toml").read_text()
        trt_documented = {
            line.split("=")[0].strip() for line in trt.splitlines() if "=" in line and "#" in line
        }
        for f in fields:
            key = f.split("=")[0].strip()
            assert key in documented | base_documented | trt_documented, (name, key)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["tensorrt"]["decode"].update(seq=[1, 12, 9]),
            r"opt 12 is outside \[min, max\]",
        ),
        (
            lambda d: d["tensorrt"]["decode"].update(seq=[1, 3, 5]),
            r"seq max 5 is below the verify width k_max \+ 1 = 9",
        ),
        (lambda d: d["tensorrt"]["decode"].update(past_len=[0, 512, 9000]), "exceeds max_context"),
        (lambda d: d.update(precision="int3"), "precision 'int3' is not one of"),
        (lambda d: d.update(providers=["cpu"]), "fp16 graphs with the cpu provider"),
        (lambda d: d["speculation"].update(k_default=12), "k_default <= k_max"),
        (lambda d: d.pop("max_context"), "'max_context' is missing"),
        (lambda d: d["memory"].update(budget_mb=0), "budget_mb must be > 0"),
        (lambda d: d["tensorrt"]["prefill"].update(batch=[1, 1, 4]), "batch max 4 > max_batch"),
    ],
)
def test_invalid_profiles_are_refused_naming_the_field_and_reason(
    change: Any, message: str
) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile(mutated("gpu-datacenter", change), "custom.toml")


def test_a_users_own_toml_file_works(tmp_path: Path) -> None:
    import importlib.resources as resources

    text = resources.files("specx.profiles").joinpath("cpu.toml").read_text()
    path = tmp_path / "mine.toml"
    path.write_text(text.replace('name = "cpu"', 'name = "mine"').replace("2048", "1024"))
    profile = load_profile(str(path))
    assert profile.name == "mine" and profile.max_context == 1024


def test_an_unknown_profile_name_lists_the_builtins() -> None:
    with pytest.raises(ProfileError, match=r"no profile named 'tpu'.*jetson-orin-nano-8gb"):
        load_profile("tpu")


def llama_1b_config(folder: Path) -> str:
    """A Llama-3.2-1B-shaped config without weights: the planner needs nothing more."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ).save_pretrained(folder)
    return str(folder)


@needs_exporter
def test_a_pair_at_full_context_on_an_orin_nano_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    from specx.exporter import ExportOptions, export_pair

    target = llama_1b_config(tmp_path / "target")  # config only: loading weights would fail
    data = mutated("jetson-orin-nano-8gb", lambda d: None)
    data["max_context"] = 131072
    data["tensorrt"]["prefill"]["past_len"] = [0, 0, 131072 - 128]
    data["tensorrt"]["decode"]["past_len"] = [0, 512, 131072 - 7]
    custom = tmp_path / "nano-full.toml"
    custom.write_text(to_toml(data))
    lines: list[str] = []
    with pytest.raises(ExportError, match=r"needs \d+ MB but profile .* allows 5000 MB") as err:
        export_pair(
            target,
            [f"self={target}"],
            tmp_path / "out",
            ExportOptions(profile=str(custom)),
            log=lines.append,
        )
    assert "lower max_context to" in str(err.value)
    assert any("KV cache (131072 tokens)" in line for line in lines)  # the plan was printed
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.partial-*"))


@needs_exporter
def test_the_same_pair_fits_the_nano_profile_as_shipped(tmp_path: Path) -> None:
    from specx.exporter.drafts import resolve_drafts
    from specx.exporter.planning.profile import plan_pair

    target = llama_1b_config(tmp_path / "target")
    lines: list[str] = []
    drafts = resolve_drafts([target], target)
    assert [(d.name, d.kind.name) for d in drafts] == [("self", "self")]
    result = plan_pair(load_profile("jetson-orin-nano-8gb"), target, drafts, False, lines.append)
    assert result.fits and 2000 < result.total_mb < 5000


@needs_exporter
def test_a_context_above_the_models_limit_is_refused(tmp_path: Path, tokenizer: Any) -> None:
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    model = tiny_models.build_model("llama", tokenizer.get_vocab_size(), seed=1)  # 256 positions
    src = tiny_models.save(model, tokenizer, tmp_path / "m")
    with pytest.raises(ExportError, match="max_context 2048 is above the 256 positions"):
        export_pair(str(src), [], tmp_path / "out", ExportOptions(profile="cpu"), log=print)


@needs_exporter
def test_fp16_graphs_keep_fp32_logits_and_record_fp16_parity(fp16_pair: TinyPair) -> None:
    manifest = Manifest.read(fp16_pair.artifact)
    assert manifest.profile is not None and manifest.profile["name"] == "gpu-datacenter"
    for spec in (manifest.target, *manifest.drafts):
        assert spec.dtype == "float16" and spec.variant == "fp16"
        assert spec.outputs[0].dtype == "float32"  # logits
        assert spec.inputs[2].dtype == "float16"  # caches
        assert spec.parity["passed"] and spec.parity["dtype"] == "float16"
        assert spec.parity["max_abs_logit_diff"] > 1e-5  # really fp16, not fp32 in disguise
    assert manifest.max_length == 256


@needs_exporter
def test_an_fp16_artifact_runs_on_the_cpu_fallback_with_exact_speculation(
    fp16_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(fp16_pair.artifact)
    assert pipe.providers[-1] == "cpu"  # the profile's GPU providers are not usable here
    prompt = np.array([10, 20, 30, 40], dtype=np.int64)
    alone = pipe.generate(prompt, max_new_tokens=40, k=0).token_ids
    spec = pipe.generate(prompt, max_new_tokens=40, k=4, drafter="mixed")
    assert spec.token_ids == alone
    assert spec.stats.accepted > 0


@needs_exporter
def test_k_above_the_profiles_k_max_is_refused(fp16_pair: TinyPair) -> None:
    from specx.runtime.errors import InputError

    pipe = Pipeline.load(fp16_pair.artifact)
    with pytest.raises(InputError, match="exceeds the profile's k_max 8"):
        pipe.generate("The cat", k=9)


@needs_exporter
def test_plain_graphs_use_only_operators_tensorrt_parses(
    llama_plain_pair: TinyPair, gpt2_pair: TinyPair, fp16_pair: TinyPair
) -> None:
    from specx.exporter.tensorrt.parser_ops import unsupported_ops

    for pair in (llama_plain_pair, gpt2_pair, fp16_pair):
        manifest = Manifest.read(pair.artifact)
        for spec in (manifest.target, *manifest.drafts):
            assert unsupported_ops(pair.artifact / spec.graph) == [], (pair.arch, spec.graph)


@needs_exporter
def test_the_op_check_catches_contrib_and_quantization_ops(
    tmp_path: Path, llama_pair: TinyPair
) -> None:
    from specx.exporter import ExportOptions, export_pair
    from specx.exporter.tensorrt.parser_ops import unsupported_ops

    out = tmp_path / "q"
    export_pair(
        str(llama_pair.sources["target"]),
        ["int8", "int4"],
        out,
        ExportOptions(max_length=64),
        log=lambda _m: None,
    )
    assert "MatMulInteger" in unsupported_ops(out / "int8.onnx") or any(
        "DynamicQuantize" in op for op in unsupported_ops(out / "int8.onnx")
    )
    assert "com.microsoft:MatMulNBits" in unsupported_ops(out / "int4.onnx")
    assert "com.microsoft:GroupQueryAttention" in unsupported_ops(out / "target.onnx")


@needs_exporter
def test_engines_without_tensorrt_fail_cleanly_before_any_work(
    tmp_path: Path, llama_pair: TinyPair
) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    from specx.exporter import ExportOptions, export_pair

    with pytest.raises(ProviderError, match="TensorRT is not installed"):
        export_pair(
            str(llama_pair.sources["target"]),
            [],
            tmp_path / "out",
            ExportOptions(profile="gpu-datacenter", engines=True),
            log=lambda _m: None,
        )
    assert list(tmp_path.iterdir()) == []


def test_the_cli_lists_profiles() -> None:
    from click.testing import CliRunner

    from specx.apps.cli.main import main

    result = CliRunner().invoke(main, ["profiles"])
    assert result.exit_code == 0
    for name in REQUIRED:
        assert name in result.output
    shown = CliRunner().invoke(main, ["profiles", "jetson-orin-nano-8gb"])
    assert json.loads(shown.output)["max_context"] == 2048

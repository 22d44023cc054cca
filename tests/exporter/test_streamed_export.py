"""The streamed export: weights read one tensor at a time, as transformers loads them.

- Every tensor the exporter streams equals what `from_pretrained` loads, for folders of every
  family and for GGUF files (the equivalence the parity check rests on); the streamed reference
  model computes the loaded model's logits.
- A stand-in of a 7B config traces without taking memory.
- Peak memory in a subprocess, for 4, 8 and 16 layers (and a wide model), at fp32 and int4:
  it grows with the part of the graph the parity check holds, not with the layer count.
- An export that cannot fit on the disk is refused with exit 2 before anything is written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from specx.apps.cli.main import main
from tests.tiny_models import build_model, build_tokenizer, save

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "smollm3", "granite", "olmo2"]
ROOT = Path(__file__).resolve().parents[2]


def _loaded(source: str) -> Any:
    from specx.exporter.weights.load import load_source

    return load_source(source, lambda _m: None).model


def _streamed(source: str) -> Any:
    from specx.exporter.weights.load import open_source

    return open_source(source, lambda _m: None)


def _assert_same_tensors(source: str) -> None:
    loaded = _loaded(source)
    streamed = _streamed(source)
    names = [n for n, _ in loaded.named_parameters(remove_duplicate=False)]
    assert names == [n for n, _ in streamed.model.named_parameters(remove_duplicate=False)]
    for name, p in loaded.named_parameters(remove_duplicate=False):
        np.testing.assert_array_equal(streamed.weights.tensor(name), p.detach().numpy(), name)


@pytest.mark.parametrize("arch", [*FAMILIES, "gpt2"])
def test_streamed_tensors_equal_what_from_pretrained_loads_from_a_folder(
    arch: str, tmp_path: Path
) -> None:
    model = build_model(arch, 320, seed=3)
    folder = save(model, build_tokenizer(320), tmp_path / arch)
    _assert_same_tensors(str(folder))


@pytest.mark.parametrize("arch,head", [("qwen2", "Q8_0"), ("llama", None)])
def test_streamed_tensors_equal_what_from_pretrained_loads_from_a_gguf_file(
    arch: str, head: str | None, tmp_path: Path
) -> None:
    """Llama files permute q/k rows (transformers' processor undoes it); head None: tied."""
    pytest.importorskip("gguf")
    from tests.gguf_models import write_gguf

    path = write_gguf(tmp_path / f"{arch}.gguf", arch, seed=2, head=head)
    _assert_same_tensors(str(path))


def test_a_wrong_tensor_in_the_source_is_caught_by_the_comparison(tmp_path: Path) -> None:
    """Negative control for the two tests above: another model's weights differ."""
    folder = save(build_model("llama", 320, seed=3), build_tokenizer(320), tmp_path / "a")
    other = save(build_model("llama", 320, seed=4), build_tokenizer(320), tmp_path / "b")
    streamed = _streamed(str(folder))
    loaded = _loaded(str(other))
    name = "model.layers.0.self_attn.q_proj.weight"
    want = loaded.get_parameter(name).detach().numpy()
    assert not np.array_equal(streamed.weights.tensor(name), want)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "gpt2"])
def test_the_streamed_model_computes_the_loaded_models_logits(arch: str, tmp_path: Path) -> None:
    import torch

    folder = save(build_model(arch, 320, seed=5), build_tokenizer(320), tmp_path / arch)
    ids = torch.tensor([[5, 17, 42, 7, 99, 3, 250]])
    with torch.no_grad():
        want = _loaded(str(folder))(ids).logits
        got = _streamed(str(folder)).model(ids).logits
        again = _streamed(str(folder)).model(ids).logits  # weights dropped and read again
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(again, want, rtol=0, atol=0)


STAND_IN = """
import resource, sys
from transformers import Qwen2Config
from specx.exporter.weights.sources import stand_in
import torch
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                  num_attention_heads=28, num_key_value_heads=4, vocab_size=152064)
model = stand_in(cfg, torch.float32)
params = sum(p.numel() for p in model.parameters())
with torch.no_grad():
    model(torch.tensor([[1, 2, 3]]))
print(params, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_stand_in_of_a_7b_config_runs_without_taking_its_memory() -> None:
    """28 layers of hidden 3584 (Qwen2.5-7B's shape): 30 GB of float32 parameters whose pages
    are never written, so a forward pass over them takes no memory."""
    out = subprocess.run(
        [sys.executable, "-c", STAND_IN], capture_output=True, text=True, check=True, cwd=ROOT
    )
    params, grew_kb = (int(x) for x in out.stdout.split())
    assert params > 7e9
    assert grew_kb * 1024 < 1.5e9, f"the stand-in took {grew_kb / 1e6:.1f} GB"


EXPORT = """
import json, sys
from specx.exporter import ExportOptions, export_pair
import onnxruntime, torch, transformers  # the libraries, loaded before the baseline
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
source, out, precision, part_bytes = sys.argv[1:5]
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:  # the high-water mark starts again from here
    f.write("5")
options = ExportOptions(max_length=64, precision=precision, check_part_bytes=int(part_bytes))
export_pair(source, [], out, options, lambda _m: None)
print(json.dumps({"base": base, "peak": status("VmHWM")}))
"""
# VmHWM, not getrusage: a child's ru_maxrss starts at the resident size of the process it was
# forked from (the kernel carries it over exec), so under a large pytest process it reads the
# parent's size, and every export below it grows by "0".


def _export_rss(
    source: Path, out: Path, precision: str, part_bytes: int = 1 << 40
) -> tuple[float, float]:
    """(peak resident bytes above the loaded libraries, the graph's weight bytes)."""
    env = {"SPECX_EXPORT_NO_PREFLIGHT": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", EXPORT, str(source), str(out), precision, str(part_bytes)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rss = json.loads(result.stdout.strip().splitlines()[-1])
    graph = json.loads((out / "manifest.json").read_text())["target"]["weight_bytes"]
    return rss["peak"] - rss["base"], float(graph)


PART = 64 << 20  # bytes: the check's part size in the test below (a layer is 38 MB at fp32)


@pytest.mark.slow
def test_peak_memory_grows_with_the_part_checked_not_with_the_layer_count(
    tmp_path: Path,
) -> None:
    """Random Qwen2 models of 4, 8 and 16 layers (38 MB of float32 weights a layer) and a wide
    one of 4 (hidden 2048), exported at fp32 and int4 in a fresh process each, the check in
    parts of 64 MB. The old export (the model loaded whole, traced, its weights held again while
    written) peaked at more than twice the float32 model; a streamed one holds one part of the
    graph in ONNX Runtime for the check, plus a layer's worth of tensors: the same for 4 and
    16 layers. Negative control: the 16-layer fp32 graph checked whole holds all of it.
    Layers that only nudge the embedding and a tied head keep each position's own token far
    ahead in the logits, so the int4 graph's argmax agrees with the float32 source's."""
    tok = build_tokenizer(320)
    shapes = {"4": (4, 1024), "8": (8, 1024), "16": (16, 1024), "wide": (4, 2048)}
    grown: dict[tuple[str, str], float] = {}
    for name, (layers, hidden) in shapes.items():
        model = build_model("qwen2", 320, seed=1, layers=layers, hidden=hidden, init_range=0.02)
        for layer in model.model.layers:  # layers that nudge the residual stream
            layer.self_attn.o_proj.weight.data *= 0.01
            layer.mlp.down_proj.weight.data *= 0.01
        folder = save(model, tok, tmp_path / f"src-{name}")
        fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
        del model
        layer_bytes = fp32_bytes / layers
        for precision in ("fp32", "int4"):
            out = tmp_path / f"{name}-{precision}"
            grew, graph = _export_rss(folder, out, precision, PART)
            shutil.rmtree(out)  # measured: the disk back (the five sources and ten exports: 4 GB)
            grown[(name, precision)] = grew
            # a part in ONNX Runtime (mapped and copied), one layer's float32 tensors with
            # their conversion's temporaries, and what tracing and the reference pass take
            part = min(graph, PART + layer_bytes)
            bound = 2.0 * part + layer_bytes + 250e6
            assert grew < bound, f"{name} {precision}: {grew / 1e6:.0f} MB > {bound / 1e6:.0f}"
            if precision == "int4" and layers == 16:
                assert grew < fp32_bytes, f"{grew / 1e6:.0f} MB: the float32 model's size"
        if name != "16":  # the 16-layer source is checked whole below
            shutil.rmtree(folder)
    layer_bytes = 38e6
    for precision in ("fp32", "int4"):
        more = grown[("16", precision)] - grown[("4", precision)]
        assert more < layer_bytes + 50e6, f"{precision}: 16 layers took {more / 1e6:.0f} MB more"
    whole, graph = _export_rss(tmp_path / "src-16", tmp_path / "16-whole", "fp32")
    assert whole > grown[("16", "fp32")] + graph / 2, "checked whole, the graph is held"


def test_an_export_the_disk_cannot_hold_is_refused_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specx.exporter.planning import preflight

    folder = save(build_model("llama", 320, seed=3), build_tokenizer(320), tmp_path / "m")
    monkeypatch.setattr(preflight, "free_disk", lambda _out: 1000.0)
    out = tmp_path / "artifact"
    result = CliRunner().invoke(main, ["export", "--target", str(folder), "-o", str(out)])
    assert result.exit_code == 2
    assert "on disk" in result.output and "GB free" in result.output
    assert not out.exists() and not list(tmp_path.glob(".artifact*"))


def test_an_export_the_memory_cannot_hold_is_refused_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specx.exporter.planning import preflight

    folder = save(build_model("llama", 320, seed=3), build_tokenizer(320), tmp_path / "m")
    monkeypatch.setattr(preflight, "available_memory", lambda: 1e6)
    monkeypatch.delenv("SPECX_EXPORT_NO_PREFLIGHT", raising=False)
    out = tmp_path / "artifact"
    result = CliRunner().invoke(main, ["export", "--target", str(folder), "-o", str(out)])
    assert result.exit_code == 2
    assert "of memory at its peak" in result.output and "--precision int4" in result.output
    assert not out.exists()


def test_the_export_reports_its_estimate_and_each_layer_written(tmp_path: Path) -> None:
    folder = save(build_model("llama", 320, seed=3, layers=3), build_tokenizer(320), tmp_path / "m")
    result = CliRunner().invoke(
        main, ["export", "--target", str(folder), "-o", str(tmp_path / "a"), "--max-length", "64"]
    )
    assert result.exit_code == 0, result.output
    assert "estimate: about" in result.output
    for i in (1, 2, 3):
        assert f"target: layer {i}/3 written" in result.output


def test_an_export_parses_each_gguf_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' loader parses a GGUF for the config and again for the tokenizer, the
    preflight for the estimate and GgufBlocks for the tensors: one parse is shared by all."""
    gguf = pytest.importorskip("gguf")
    from specx.exporter import ExportOptions, export_pair
    from tests.gguf_models import write_gguf

    target = write_gguf(tmp_path / "target.gguf", "qwen2", seed=0)
    draft = write_gguf(tmp_path / "draft.gguf", "qwen2", seed=0, redraw=("blk.1.ffn_up.weight",))
    parsed: list[str] = []
    real = gguf.GGUFReader

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    options = ExportOptions(max_length=64, precision="int4")
    export_pair(str(target), [str(draft)], tmp_path / "out", options, log=lambda _m: None)
    assert sorted(parsed) == ["draft.gguf", "target.gguf"]
    assert gguf.GGUFReader is counting  # the export restored what it patched


def test_the_reference_of_padded_sequences_equals_each_sequences_own_pass(
    tmp_path: Path,
) -> None:
    """Parity and calibration share one forward pass of the source, the shorter sequence
    padded after its end: a causal model's scores up to a position ignore what follows."""
    import torch

    from specx.exporter.checks.parity import references

    folder = save(build_model("qwen2", 320, seed=5), build_tokenizer(320), tmp_path / "m")
    src = _streamed(str(folder))
    short = np.array([5, 17, 42, 7], dtype=np.int64)
    long = np.array([9, 3, 250, 11, 64, 8, 100, 2, 31], dtype=np.int64)
    refs = references(src, [short, long])
    for ref, ids in zip(refs, (short, long), strict=True):
        with torch.no_grad():
            alone = src.model(torch.from_numpy(ids)[None]).logits[0].numpy()
        assert ref.logits.shape == alone.shape
        np.testing.assert_allclose(ref.logits, alone, rtol=0, atol=1e-5)
    # negative control: scores of another sequence do not pass for these
    assert not np.allclose(refs[0].logits, refs[1].logits[: len(short)], atol=1e-5)

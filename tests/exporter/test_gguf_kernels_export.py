"""`specx export --precision int4 --kernels specx`: graphs whose matmuls and embedding gather run
on specx's own kernels over the GGUF file's blocks, byte for byte, with every verify row
bit-identical to a one-token pass, so that greedy speculation equals the target alone with int8
activations and no near-tie allowance. Tiny GGUF files of every held type (tests/gguf_models.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from kernel_tools import kernels_path

pytest.importorskip("gguf")

from specx.apps.cli.main import main
from specx.exporter import ExportOptions, export_pair
from specx.runtime import Pipeline
from specx.runtime.errors import ArtifactError, ExportError
from tests import gguf_models
from tests.gguf_models import write_gguf


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def files(tmp_path_factory: Any) -> dict[str, Path]:
    kernels_path()  # skipped (or failed, where the test command requires it) without the library
    folder = tmp_path_factory.mktemp("gguf")
    redraw = ("blk.1.ffn_down.weight",)
    return {
        "qwen2": write_gguf(folder / "qwen2.gguf", "qwen2", seed=0),
        "draft": write_gguf(folder / "draft.gguf", "qwen2", seed=0, redraw=redraw),
        "llama": write_gguf(folder / "llama.gguf", "llama", seed=1, head=None),
    }


def export(files: dict[str, Path], out: Path, target: str, drafts: list[str], **kw: Any) -> Path:
    options = ExportOptions(max_length=128, precision="int4", **kw)
    export_pair(str(files[target]), [str(files[d]) for d in drafts], out, options, quiet)
    return out


@pytest.fixture(scope="module")
def pair(files: dict[str, Path], tmp_path_factory: Any) -> Path:
    out = tmp_path_factory.mktemp("specx") / "pair"
    return export(files, out, "qwen2", ["draft"], kernels="specx")


@pytest.fixture(scope="module")
def llama(files: dict[str, Path], tmp_path_factory: Any) -> Path:
    return export(files, tmp_path_factory.mktemp("specx") / "llama", "llama", [], kernels="auto")


def block_initializers(graph: Path) -> dict[str, tuple[str, np.ndarray]]:
    """node name -> (blocks initializer name, its bytes) of every specx node of the graph."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    inits = {t.name: t for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.domain == "specx" and node.op_type != "GroupQueryAttention":
            name = node.input[1] if node.op_type == "GgufMatMul" else node.input[0]
            found[node.name] = (
                name,
                numpy_helper.to_array(inits[name], base_dir=str(graph.parent)),
            )
    return found


def row_set(raw: np.ndarray) -> np.ndarray:
    """The rows of a block matrix as sorted opaque records (rows a loader permutes compare)."""
    return np.sort(np.ascontiguousarray(raw).view(f"V{raw.shape[1]}").reshape(-1))


def test_the_graph_holds_the_files_blocks_byte_for_byte(
    pair: Path, llama: Path, files: dict[str, Path]
) -> None:
    """Qwen2 (an untied Q8_0 head) and Llama (q/k rows permuted by the loader, the head tied
    to the Q4_K table: one initializer serves the gather and the head)."""
    from gguf import GGUFReader

    for folder, file, tied in ((pair, files["qwen2"], False), (llama, files["llama"], True)):
        spec = json.loads((folder / "manifest.json").read_text())["target"]
        assert spec["parity"]["weights"]["kernels"] == "specx"
        assert spec["parity"]["weights"]["requantized"] == {}
        assert spec["op_libraries"][0]["domain"] == "specx"
        assert "com.microsoft:MatMulNBits" not in spec["operators"]
        reader = GGUFReader(str(file))
        stored = {t.name: np.asarray(t.data) for t in reader.tensors if t.tensor_type.name != "F32"}
        nodes = block_initializers(folder / spec["graph"])
        names = {name for name, _ in nodes.values()}
        assert len(nodes) == len(stored) + tied and len(names) == len(stored)
        unmatched = dict(stored)
        for name, raw in {name: raw for name, raw in nodes.values()}.items():
            match = next(
                (k for k, v in unmatched.items() if v.shape == raw.shape
                 and np.array_equal(row_set(v), row_set(raw))),
                None,
            )  # fmt: skip
            assert match is not None, f"{name} holds no tensor of the file"
            del unmatched[match]
        assert unmatched == {}


def test_verify_rows_are_bit_identical_to_one_token_passes(pair: Path, llama: Path) -> None:
    """Matmuls and the in-place cache attention both on the specx kernels."""
    for folder in (pair, llama):
        manifest = json.loads((folder / "manifest.json").read_text())
        for spec in (manifest["target"], *manifest["drafts"]):
            assert spec["attention"] == "gqa"
            assert "specx:GroupQueryAttention" in spec["operators"]
            assert "com.microsoft:GroupQueryAttention" not in spec["operators"]
            calibration = spec["parity"]["calibration"]
            assert calibration["passes_max_abs_logit_diff"] == 0.0
            assert calibration["passes_parted"] == 0
    pipe = Pipeline.load(pair)
    target = pipe.target.fork()
    ids = np.array([5, 17, 42, 8, 99, 3, 64, 23, 11, 7], np.int64)
    one = target.new_cache(64)
    rows = np.concatenate([target.forward(ids[i : i + 1], one).copy() for i in range(len(ids))])
    for k in (1, 3, 8):
        cache = target.new_cache(64)
        head = target.forward(ids[:1], cache).copy()
        wide = target.forward(ids[1 : k + 2], cache).copy()  # a K + 1-row pass
        got = np.concatenate([head, wide])
        assert np.array_equal(got.view(np.uint32), rows[: k + 2].view(np.uint32)), k


@pytest.mark.parametrize("drafter", ["draft", "ngram", "ngram+draft"])
def test_greedy_speculation_equals_the_target_alone_for_every_k(pair: Path, drafter: str) -> None:
    pipe = Pipeline.load(pair)
    for prompt in ("The cat is", "1 2 3 1 2 3 1 2"):
        alone = pipe.generate(prompt, max_new_tokens=40, k=0)
        for k in (*range(1, 9), "auto"):
            spec = pipe.generate(prompt, max_new_tokens=40, k=k, drafter=drafter)
            assert spec.token_ids == alone.token_ids, (prompt, k)


def test_a_control_on_onnx_runtimes_kernels_holds_other_bytes(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """Negative control: the same file with --kernels ort holds MatMulNBits blocks, no specx op,
    and no op library in its manifest."""
    out = export(files, tmp_path / "ort", "qwen2", [], kernels="ort")
    spec = json.loads((out / "manifest.json").read_text())["target"]
    assert "op_libraries" not in spec and spec["parity"]["weights"]["kernels"] == "ort"
    assert not [op for op in spec["operators"] if op.startswith("specx:")]
    assert block_initializers(out / spec["graph"]) == {}


def test_a_type_the_kernels_do_not_hold_exits_2_naming_it_and_the_fallback(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(gguf_models.F16_FIELDS, "Q3_K", (108,))  # its fp16 scale's offset
    types = dict(gguf_models.MATRIX_TYPES, attn_output="Q3_K")
    path = write_gguf(tmp_path / "q3k.gguf", "qwen2", seed=2, types=types)
    out = tmp_path / "artifact"
    args = ["export", "--target", str(path), "-o", str(out), "--precision", "int4"]
    result = CliRunner().invoke(main, [*args, "--kernels", "specx"])
    assert result.exit_code == 2, result.output
    assert "Q3_K" in result.output and "--kernels ort" in result.output
    assert not out.exists()
    # auto takes ONNX Runtime's kernels for such a file
    options = ExportOptions(max_length=64, precision="int4", kernels="auto")
    export_pair(str(path), [], out, options, quiet)
    spec = json.loads((out / "manifest.json").read_text())["target"]
    assert spec["parity"]["weights"]["kernels"] == "ort"


def test_an_artifact_on_specx_kernels_without_the_library_is_refused_with_advice(
    pair: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECX_KERNELS_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(ArtifactError, match=r"scripts/build_kernels\.sh"):
        Pipeline.load(pair)
    result = CliRunner().invoke(main, ["run", str(pair), "-p", "hi", "-n", "4"])
    assert result.exit_code == 2 and "--kernels ort" in result.output
    with pytest.raises(ExportError, match="not built here"):  # before any work
        options = ExportOptions(precision="int4", kernels="specx")
        export_pair(str(files["qwen2"]), [], tmp_path / "x", options, quiet)
    assert not (tmp_path / "x").exists()


def test_info_says_which_kernels_the_artifact_needs_and_where_they_dispatch(pair: Path) -> None:
    result = CliRunner().invoke(main, ["info", str(pair), "--json"])
    assert result.exit_code == 0, result.output
    kernels = json.loads(result.output)["kernels"]
    assert kernels["needed_by"] == ["draft.onnx", "target.onnx"]
    assert kernels["ops"] == ["specx:GgufGather", "specx:GgufMatMul", "specx:GroupQueryAttention"]
    assert kernels["library"]["isa"] in ("scalar", "avx2", "avx512vnni", "neon")
    text = CliRunner().invoke(main, ["info", str(pair)]).output
    assert "need specx kernels (GgufGather, GgufMatMul, GroupQueryAttention); loaded from" in text

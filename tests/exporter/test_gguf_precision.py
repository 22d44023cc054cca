"""`specx export --precision int4/int8`: quantized graphs that carry a GGUF file's own blocks.

Tiny random models are written as GGUF files with every carried block type (tests/gguf_models.py)
and exported at int4; the graph's MatMulNBits weights must dequantize to exactly the weights
transformers reads from the same file (negative control: the same model requantized from a
float folder does not). Greedy speculation on the int4 pair must equal the int4 target alone
where the passes compute alike (fp32 compute), and the export must record how often int8-compute
passes part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("gguf")

from specx.apps.cli.main import main
from specx.exporter import ExportOptions, export_pair
from specx.runtime import Pipeline
from specx.runtime.errors import ExportError
from tests.gguf_models import write_gguf
from tests.tiny_models import save


def quiet(_: str) -> None:
    pass


def graph_weights(graph: Path) -> list[np.ndarray]:
    """Every MatMulNBits weight W [N, K] of a graph, as it computes with it (with the shift
    term the exporter adds for formats that keep block minimums)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        n, k, bits, block = attrs["N"], attrs["K"], attrs["bits"], attrs["block_size"]
        b, scales, zp = (inits[i] for i in node.input[1:4])
        if bits == 4:
            codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, k)
            zero = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, : k // block]
        else:
            codes, zero = b.reshape(n, k), zp.reshape(n, k // block)
        steps = codes.reshape(n, -1, block).astype(np.float32) - zero[..., None]
        w = (steps * scales.reshape(n, -1, 1)).reshape(n, k)
        for add in consumers.get(node.output[0], []):
            if add.op_type != "Add":
                continue
            other = producers.get(next(i for i in add.input if i != node.output[0]))
            if other is None or other.op_type != "MatMul" or other.input[1] not in inits:
                continue  # a bias
            shift = inits[other.input[1]]  # [K / block, N]
            w += np.repeat(shift.T, block, axis=1)
        out.append(w)
    return out


def graph_embedding(graph: Path) -> np.ndarray:
    """The embedding table [V, H] a graph gathers from (GatherBlockQuantized, with the shift
    the exporter adds for formats that keep block minimums)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    (node,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    attrs = {a.name: a.i for a in node.attribute}
    data, scales, zp = inits[node.input[0]], inits[node.input[2]], inits[node.input[3]]
    v, nb = scales.shape
    block = attrs["block_size"]
    if attrs["bits"] == 4:
        codes = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(v, -1)
        zero = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(v, -1)[:, :nb]
    else:
        codes, zero = data, zp
    steps = codes.reshape(v, nb, block).astype(np.float32) - zero[..., None]
    table = steps * scales[..., None]
    if "nbits.embedding.shift" in inits:
        table += inits["nbits.embedding.shift"][..., None]
    return table.reshape(v, -1)


def loaded_embedding(path: Path) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.get_input_embeddings().weight.detach().numpy()


def loaded_weights(path: Path) -> list[np.ndarray]:
    """The linear weights [out, in] transformers reads from a GGUF file (head included)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    names = ("proj.weight", "lm_head.weight")
    weights = [p.detach().numpy() for n, p in model.named_parameters() if n.endswith(names)]
    if model.config.tie_word_embeddings:
        weights.append(model.get_input_embeddings().weight.detach().numpy())
    return weights


def assert_same_weights(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    unmatched = list(got)
    for w in want:
        scale = float(np.abs(w).max())
        match = next(
            (
                i
                for i, g in enumerate(unmatched)
                if g.shape == w.shape and np.abs(g - w).max() <= 1e-6 * scale
            ),
            None,
        )
        assert match is not None, f"no graph weight equals a {w.shape} weight of the file"
        unmatched.pop(match)


def assert_within_a_step(got: list[np.ndarray], want: list[np.ndarray], bits: int) -> None:
    """Each weight of `want` has a graph weight of its shape within one `bits`-bit step of each of
    its blocks of 32 (round-to-nearest from the file's values: half a step, a whole one where the
    zero point's rounding clips), and not all of them are exact."""
    assert len(got) == len(want)
    unmatched, inexact = list(got), 0
    for w in want:
        blocks = w.reshape(w.shape[0], -1, 32)
        span = np.maximum(blocks.max(axis=2), 0) - np.minimum(blocks.min(axis=2), 0)
        bound = np.repeat(span / (2**bits - 1), 32, axis=1) + 1e-6 * float(np.abs(w).max())
        match = next(
            (
                i
                for i, g in enumerate(unmatched)
                if g.shape == w.shape and bool(np.all(np.abs(g - w) <= bound))
            ),
            None,
        )
        assert match is not None, f"no graph weight is within a step of a {w.shape} weight"
        inexact += float(np.abs(unmatched.pop(match) - w).max()) > 1e-6 * float(np.abs(w).max())
    assert inexact > 0


@pytest.fixture(scope="module")
def files(tmp_path_factory: Any) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    redraw = ("blk.1.ffn_down.weight",)  # the draft: one matrix of the target drawn anew
    return {
        "qwen2": write_gguf(folder / "qwen2.gguf", "qwen2", seed=0),
        "draft": write_gguf(folder / "draft.gguf", "qwen2", seed=0, redraw=redraw),
        "llama": write_gguf(folder / "llama.gguf", "llama", seed=1, head=None),
    }


@pytest.fixture(scope="module")
def int4_pair(files: dict[str, Path], tmp_path_factory: Any) -> Path:
    out = tmp_path_factory.mktemp("int4") / "artifact"
    options = ExportOptions(max_length=128, precision="int4", quant_compute="fp32")
    export_pair(str(files["qwen2"]), [str(files["draft"])], out, options, quiet)
    return out


@pytest.fixture(scope="module")
def int4_llama(files: dict[str, Path], tmp_path_factory: Any) -> Path:
    out = tmp_path_factory.mktemp("int4") / "llama"
    options = ExportOptions(max_length=128, precision="int4", quant_compute="fp32")
    export_pair(str(files["llama"]), [], out, options, quiet)
    return out


def test_an_int4_export_carries_every_gguf_block_and_computes_with_the_files_weights(
    int4_pair: Path, int4_llama: Path, files: dict[str, Path]
) -> None:
    """Qwen2 (biases, an untied Q8_0 head) and Llama (q/k rows permuted by the loader, the head
    tied to a Q4_K embedding)."""
    qwen = json.loads((int4_pair / "manifest.json").read_text())["target"]
    llama = json.loads((int4_llama / "manifest.json").read_text())["target"]
    for folder, spec, file in (
        (int4_pair, qwen, files["qwen2"]),
        (int4_llama, llama, files["llama"]),
    ):
        assert spec["variant"] == "int4"
        weights = spec["parity"]["weights"]
        assert weights["requantized"] == {}
        kinds = set(weights["carried"])
        assert {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"} <= kinds
        assert_same_weights(graph_weights(folder / spec["graph"]), loaded_weights(file))
        want = loaded_embedding(file)
        got = graph_embedding(folder / spec["graph"])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
        calibration = spec["parity"]["calibration"]
        assert calibration["argmax_agreement"] > 0.95  # fp32 compute: only summation order
        assert calibration["passes_parted"] == 0


def test_a_draft_requantizes_wide_blocks_from_the_files_weights_and_reads_fewer_bytes(
    int4_pair: Path, files: dict[str, Path]
) -> None:
    manifest = json.loads((int4_pair / "manifest.json").read_text())
    target, draft = manifest["target"], manifest["drafts"][0]
    weights = draft["parity"]["weights"]
    assert weights["wide_blocks"] == "requantize-all"
    assert set(weights["tensors_by_bits"]) == {"4-bit", "4-bit embedding"}
    assert set(weights["requantized"].values()) == {
        f"{kind} wider than 4 bits (wide blocks: requantize-all)"
        for kind in ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
    }
    assert draft["weight_bytes"] < 0.8 * target["weight_bytes"]  # the same shapes
    got = graph_weights(int4_pair / draft["graph"])
    assert_within_a_step(got, loaded_weights(files["draft"]), bits=4)
    # negative control: the target's file differs from the draft's in one matrix
    with pytest.raises(AssertionError, match="no graph weight is within a step"):
        assert_within_a_step(got, loaded_weights(files["qwen2"]), bits=4)


def test_wide_blocks_are_requantized_or_carried_as_asked_for_either_role(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "artifact"
    options = ExportOptions(
        max_length=64,
        precision="int4",
        wide_blocks="requantize",
        draft_wide_blocks="carry",
        kernels="ort",  # MatMulNBits' blocks of 32 and its 8-bit head
    )
    export_pair(str(files["qwen2"]), [str(files["draft"])], out, options, quiet)
    manifest = json.loads((out / "manifest.json").read_text())
    target, draft = manifest["target"], manifest["drafts"][0]
    weights = target["parity"]["weights"]
    assert weights["wide_blocks"] == "requantize"
    # the body's wide blocks (Q5_K, Q6_K, Q5_0, Q5_1 in both layers) requantized, the Q8_0 head
    # and the Q4_K table carried
    assert len(weights["requantized"]) == 8 and weights["carried"]["Q8_0"] == 1
    assert weights["tensors_by_bits"] == {"4-bit": 14, "8-bit": 1, "4-bit embedding": 1}
    assert draft["parity"]["weights"]["requantized"] == {}
    assert_same_weights(graph_weights(out / draft["graph"]), loaded_weights(files["draft"]))


def test_an_unknown_wide_blocks_choice_is_refused_with_exit_2(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "artifact"
    args = ["export", "--target", str(files["qwen2"]), "-o", str(out), "--precision", "int4"]
    result = CliRunner().invoke(main, [*args, "--draft-wide-blocks", "round"])
    assert result.exit_code == 2
    assert "round" in result.output and not out.exists()
    with pytest.raises(ExportError, match="--wide-blocks must be one of carry, requantize"):
        export_pair(str(files["qwen2"]), [], out, ExportOptions(wide_blocks="round"), quiet)
    assert not out.exists()


def test_the_cli_offers_the_exporters_wide_blocks_choices() -> None:
    from specx.apps.cli.export import WIDE_BLOCKS
    from specx.exporter.weights.nbits import WIDE_BLOCKS as EXPORTER_CHOICES

    assert tuple(WIDE_BLOCKS.choices) == EXPORTER_CHOICES


def test_the_same_model_requantized_from_floats_does_not_match_the_files_weights(
    files: dict[str, Path], tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = files["qwen2"]
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    plain = type(model)(type(model.config)(**model.config.to_dict()))
    plain.load_state_dict(model.state_dict())
    folder = tmp_path / "float"
    plain.save_pretrained(folder)
    tok.save_pretrained(folder)
    out = tmp_path / "artifact"
    export_pair(str(folder), [], out, ExportOptions(max_length=64, precision="int4"), quiet)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["parity"]["weights"]["carried"] == {}
    with pytest.raises(AssertionError, match="no graph weight equals"):
        assert_same_weights(graph_weights(out / "target.onnx"), loaded_weights(path))
    gap = np.abs(graph_embedding(out / "target.onnx") - loaded_embedding(path)).max()
    assert gap > 1e-4


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculation_on_the_int4_pair_equals_the_int4_target_alone(
    int4_pair: Path, k: int
) -> None:
    pipe = Pipeline.load(int4_pair)
    alone = pipe.generate("The cat is", max_new_tokens=40, k=0)
    spec = pipe.generate("The cat is", max_new_tokens=40, k=k, drafter="draft")
    assert spec.token_ids == alone.token_ids
    assert spec.stats.accepted > 0


def test_int8_compute_records_where_its_passes_part(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    options = ExportOptions(max_length=128, precision="int4")
    export_pair(str(files["qwen2"]), [], out, options, quiet)
    parity = json.loads((out / "manifest.json").read_text())["target"]["parity"]
    assert parity["weights"]["compute"] == "int8"
    calibration = parity["calibration"]
    assert len(calibration["passes_parted_top2_gaps"]) == calibration["passes_parted"]
    assert calibration["argmax_agreement"] >= 0.5


def test_info_states_each_models_precision(int4_pair: Path) -> None:
    result = CliRunner().invoke(main, ["info", str(int4_pair), "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)
    assert {m["variant"] for m in facts["models"]} == {"int4"}
    target, draft = (m["quantization"] for m in facts["models"])
    for q in (target, draft):
        assert q["compute"] == "fp32" and q["passes_parted"] == 0
    # the target carries every block (14 matrices + head + embedding); the draft requantizes
    # the wide ones (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0) and carries the 4-bit formats
    assert target["requantized"] == 0 and sum(target["carried_from_gguf"].values()) == 16
    assert target["wide_blocks"] == "carry" and draft["wide_blocks"] == "requantize-all"
    assert set(draft["carried_from_gguf"]) == {"Q4_0", "Q4_1", "Q4_K"}
    assert draft["requantized"] + sum(draft["carried_from_gguf"].values()) == 16
    text = CliRunner().invoke(main, ["info", str(int4_pair)]).output
    assert "int4" in text and "GGUF blocks carried" in text
    assert f"wide GGUF blocks requantized: {draft['requantized']}" in text


def test_an_unknown_precision_is_refused_with_exit_2(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "artifact"
    args = ["export", "--target", str(files["qwen2"]), "-o", str(out), "--precision", "int3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "int3" in result.output and not out.exists()


def test_an_int8_export_of_a_float_folder_requantizes_in_8_bits(tmp_path: Path) -> None:
    from tests.tiny_models import build_model, build_tokenizer

    model = build_model("llama", 320, seed=3, hidden=64)
    folder = save(model, build_tokenizer(320), tmp_path / "m")
    out = tmp_path / "artifact"
    export_pair(str(folder), [], out, ExportOptions(max_length=64, precision="int8"), quiet)
    spec = json.loads((out / "manifest.json").read_text())["target"]
    assert spec["variant"] == "int8"
    assert set(spec["parity"]["weights"]["tensors_by_bits"]) == {"8-bit", "8-bit embedding"}
    assert spec["parity"]["calibration"]["argmax_agreement"] > 0.9


def test_a_quantized_copy_of_a_quantized_target_is_refused_with_exit_2(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "artifact"
    args = ["export", "--target", str(files["qwen2"]), "--draft", "int8", "-o", str(out)]
    result = CliRunner().invoke(main, [*args, "--precision", "int4"])
    assert result.exit_code == 2
    assert "--draft int8 quantizes the target's graph" in result.output and not out.exists()

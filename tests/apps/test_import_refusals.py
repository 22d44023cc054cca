"""`specx import` refuses what it cannot run before anything is written, naming the fix: graphs
made from a real Optimum export (edited with the onnx package into the shapes that older
exports and other tasks have), and a folder whose external data is gone."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from optimum_models import needs_optimum, optimum_folder

from specx.apps.importer import ImportOptions, import_pair
from specx.runtime.errors import InputError

pytestmark = needs_optimum
onnx = pytest.importorskip("onnx")


def _edited(source: Path, into: Path, edit: Callable[[Any], None], external: bool = False) -> Path:
    """`source` (an Optimum folder) copied to `into` with its graph edited by `edit`."""
    shutil.copytree(source, into, ignore=shutil.ignore_patterns("*.onnx", "*.onnx_data"))
    model = onnx.load(str(source / "model.onnx"))
    edit(model)
    data = {"location": "model.onnx_data", "size_threshold": 0} if external else {}
    onnx.save(model, str(into / "model.onnx"), save_as_external_data=external, **data)
    return into


def _refused(folder: Path, out: Path, words: str) -> InputError:
    with pytest.raises(InputError) as e:
        import_pair(folder, [], out, ImportOptions(), lambda _: None)
    assert words in e.value.message, e.value.message
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
    return e.value


def _last_position_only(model: Any) -> None:
    """logits sliced to the last position, as graphs exported for plain generation return."""
    graph = model.graph
    producer = next(n for n in graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "every_logit"
    h = onnx.helper
    for name, value in (("last_s", -1), ("last_e", 2**62), ("last_a", 1)):
        graph.initializer.append(h.make_tensor(name, onnx.TensorProto.INT64, [1], [value]))
    graph.node.append(
        h.make_node("Slice", ["every_logit", "last_s", "last_e", "last_a"], ["logits"])
    )
    out = next(o for o in graph.output if o.name == "logits")
    out.type.tensor_type.shape.dim[1].dim_value = 1


def _one_token_a_pass(model: Any) -> None:
    """input_ids [batch, 1], as Optimum 1.13's decoder_with_past took them."""
    ids = next(i for i in model.graph.input if i.name == "input_ids")
    ids.type.tensor_type.shape.dim[1].dim_value = 1


def test_a_graph_returning_only_the_last_positions_logits_is_refused(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = _edited(optimum_folders["target"], tmp_path / "last", _last_position_only)
    error = _refused(folder, tmp_path / "out", "returns only the last position's logits")
    assert "text-generation-with-past" in (error.hint or "")


def test_a_graph_taking_one_token_a_pass_is_refused(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = _edited(optimum_folders["target"], tmp_path / "legacy", _one_token_a_pass)
    error = _refused(folder, tmp_path / "out", "takes one token a pass")
    assert "Optimum >= 1.14" in (error.hint or "")


def test_a_graph_whose_external_data_is_missing_is_refused(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = _edited(optimum_folders["target"], tmp_path / "ext", lambda _m: None, external=True)
    import_pair(folder, [], tmp_path / "whole", ImportOptions(), lambda _: None)  # control
    (folder / "model.onnx_data").unlink()
    error = _refused(folder, tmp_path / "out", "onnxruntime cannot load")
    assert "external-data files are complete" in (error.hint or "")


def test_a_graph_for_another_task_is_refused(tmp_path: Path) -> None:
    """Optimum's feature-extraction export of a decoder: hidden states, no logits (refused for
    that first, whatever else it lacks)."""
    folder = optimum_folder(tmp_path, "llama", task="feature-extraction-with-past")
    error = _refused(folder, tmp_path / "out", "returns no logits")
    assert "another task" in error.message and "text-generation-with-past" in (error.hint or "")

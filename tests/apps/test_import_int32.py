"""Imported graphs whose ids, positions and mask are int32 (as some exporters make them): the
manifest records the type, and the Python runtime, libspecx and the reference consumer feed the
same values in it. The graph is a real Optimum export with its index inputs made int32 (each
cast back to int64 inside), so its logits are the original's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from optimum_models import needs_optimum

from reference import reference_consumer
from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest
from specx.runtime.errors import InputError

pytestmark = needs_optimum
onnx = pytest.importorskip("onnx")
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n"
NARROW = ("input_ids", "attention_mask", "position_ids")


def _int32_inputs(source: Path, into: Path) -> Path:
    shutil.copytree(source, into, ignore=shutil.ignore_patterns("*.onnx"))
    model = onnx.load(str(source / "model.onnx"))
    graph = model.graph
    for name in NARROW:
        wide = f"{name}_int64"
        for node in graph.node:
            node.input[:] = [wide if i == name else i for i in node.input]
        graph.node.insert(
            0, onnx.helper.make_node("Cast", [name], [wide], to=onnx.TensorProto.INT64)
        )
        next(
            i for i in graph.input if i.name == name
        ).type.tensor_type.elem_type = onnx.TensorProto.INT32
    onnx.save(model, str(into / "model.onnx"))
    return into


@pytest.fixture(scope="module")
def pairs(
    optimum_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("int32")
    narrow = _int32_inputs(optimum_folders["target"], root / "target32")
    draft = _int32_inputs(optimum_folders["draft"], root / "draft32")
    wide = root / "wide"
    import_pair(
        optimum_folders["target"], [str(optimum_folders["draft"])], wide, ImportOptions(), print
    )
    out = root / "narrow"
    import_pair(narrow, [str(draft), "suffix"], out, ImportOptions(), print)
    return wide, out


def test_int32_inputs_are_recorded_and_decode_as_the_int64_graph(pairs: tuple[Path, Path]) -> None:
    wide, narrow = pairs
    spec = Manifest.read(narrow).target
    assert {t.name: t.dtype for t in spec.inputs if t.name in NARROW} == dict.fromkeys(
        NARROW, "int32"
    )
    want = Pipeline.load(wide).generate(PROMPT, max_new_tokens=50, k=0).token_ids
    pipe = Pipeline.load(narrow)
    assert pipe.generate(PROMPT, max_new_tokens=50, k=0).token_ids == want
    for k, drafter in ((3, "draft"), ("auto", "draft"), (4, "suffix+draft")):
        assert pipe.generate(PROMPT, max_new_tokens=50, k=k, drafter=drafter).token_ids == want


def test_the_c_library_and_the_reference_consumer_feed_int32_too(pairs: tuple[Path, Path]) -> None:
    from libspecx_tools import Library

    _, narrow = pairs
    prompt = list(range(5, 40))
    want = Pipeline.load(narrow).generate(prompt, max_new_tokens=60, k=3, drafter="draft")
    model = Library().load(narrow)
    try:
        assert model.generate(prompt, 60, 3, "draft").tokens == want.token_ids
    finally:
        model.close()
    got = reference_consumer().generate(narrow, prompt, 60, "draft", 3, None)
    assert got["token_ids"] == want.token_ids


def test_a_rewrite_of_an_int32_graph_is_refused_naming_the_plain_import(
    pairs: tuple[Path, Path], tmp_path: Path
) -> None:
    narrow_folder = pairs[1].parent / "target32"
    with pytest.raises(InputError, match="int32") as e:
        import_pair(narrow_folder, [], tmp_path / "out", ImportOptions(rewrite="gqa"), print)
    assert "without --rewrite" in (e.value.hint or "")
    assert not (tmp_path / "out").exists()

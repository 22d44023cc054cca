"""Imported graphs with a `num_logits_to_keep` / `logits_to_keep` input (transformers' way of
returning only the last positions' logits): every reader feeds the pass's token count, so a
verify pass gets every row.

Optimum's exporter (0.1) does not write the input, so the test adds it to a graph Optimum made,
as transformers computes it: logits[:, -keep:, :].
"""

from __future__ import annotations

from pathlib import Path

import pytest
from optimum_models import needs_optimum

from reference import reference_consumer
from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline

pytestmark = needs_optimum
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n"


def _with_logits_to_keep(folder: Path, out: Path, name: str, rank: int) -> Path:
    """A copy of an Optimum folder whose graph takes `name` (int64, rank 0 or 1) and returns the
    logits of that many last positions."""
    import shutil

    import onnx
    from onnx import TensorProto, helper

    shutil.copytree(folder, out)
    model = onnx.load(str(out / "model.onnx"))
    graph = model.graph
    for node in graph.node:
        node.output[:] = ["specx.all_logits" if o == "logits" else o for o in node.output]
    graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, [1] * rank))
    axis = helper.make_tensor("specx.axis", TensorProto.INT64, [1], [1])
    end = helper.make_tensor("specx.end", TensorProto.INT64, [1], [2**62])
    graph.initializer.extend([axis, end])
    graph.node.extend([
        helper.make_node("Neg", [name], ["specx.neg"]),
        helper.make_node("Reshape", ["specx.neg", "specx.axis"], ["specx.start"]),  # [1]
        helper.make_node("Slice", ["specx.all_logits", "specx.start", "specx.end", "specx.axis"],
                         ["logits"]),
    ])  # fmt: skip
    onnx.save(model, str(out / "model.onnx"))
    return out


@pytest.mark.parametrize(("name", "rank"), [("num_logits_to_keep", 0), ("logits_to_keep", 1)])
def test_a_graph_that_keeps_the_last_logits_gets_every_row_from_every_reader(
    optimum_folders: dict[str, Path], tmp_path: Path, name: str, rank: int
) -> None:
    from libspecx_tools import Library

    plain, keeping = tmp_path / "plain", tmp_path / "keeping"
    import_pair(optimum_folders["target"], ["ngram"], plain, ImportOptions(), lambda _: None)
    folder = _with_logits_to_keep(optimum_folders["target"], tmp_path / "src", name, rank)
    manifest = import_pair(folder, ["ngram", "suffix"], keeping, ImportOptions(), lambda _: None)
    assert name in {t.name for t in manifest.target.inputs}
    assert manifest.target.parity["argmax_agreement"] == 1.0
    want = Pipeline.load(plain).generate(PROMPT, max_new_tokens=60, k=0).token_ids
    pipe = Pipeline.load(keeping)
    for k, drafter in ((0, "ngram"), (4, "ngram"), ("auto", "suffix")):
        got = pipe.generate(PROMPT, max_new_tokens=60, k=k, drafter=drafter, cache_scope=None)
        assert got.token_ids == want, (k, drafter)
    prompt = pipe.encode_prompt(PROMPT).tolist()
    spec = pipe.generate(prompt, max_new_tokens=60, k=4, drafter="suffix", cache_scope=None)
    consumer = reference_consumer().generate(keeping, prompt, 60, "suffix", 4, None)
    assert consumer["token_ids"] == spec.token_ids == want
    model = Library().load(keeping)
    try:
        assert model.generate(prompt, 60, 4, "suffix").tokens == want
    finally:
        model.close()

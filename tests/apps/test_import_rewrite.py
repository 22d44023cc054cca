"""`specx import --rewrite gqa`: Optimum graphs (made by the real exporter) written with their
attention as GroupQueryAttention, checked against the originals, run like specx's gqa graphs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from optimum_models import needs_optimum

from reference import reference_consumer
from specx.apps.importer import ImportOptions, import_pair, rewrite
from specx.runtime import Pipeline
from specx.runtime.errors import InputError

pytestmark = needs_optimum
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n"
REWRITE = ImportOptions(rewrite="gqa")


@pytest.fixture(scope="module")
def rewritten(optimum_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rewritten") / "pair"
    draft = str(optimum_folders["draft"])
    import_pair(optimum_folders["target"], [draft, "suffix"], out, REWRITE, lambda _: None)
    return out


@pytest.fixture(scope="module")
def original(optimum_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("original") / "pair"
    import_pair(optimum_folders["target"], ["ngram"], out, ImportOptions(), lambda _: None)
    return out


def test_a_rewritten_pair_is_a_gqa_artifact_checked_against_its_originals(rewritten: Path) -> None:
    data = json.loads((rewritten / "manifest.json").read_text())
    assert data["format_version"] == 3
    assert data["exporter"]["rewrites"] == {"target": "concat -> gqa", "draft": "concat -> gqa"}
    for model in (data["target"], *data["drafts"]):
        assert model["attention"] == "gqa" and model["graph"] == f"{model['name']}/model.onnx"
        check = model["parity"]["rewrite"]
        assert check["argmax_agreement"] == 1.0
        assert check["max_abs_logit_diff"] <= check["tolerance"]
        assert not (rewritten / model["graph"]).is_symlink()  # a new graph, written by specx
        assert {i["name"] for i in model["inputs"]} >= {"seqlens_k", "total_sequence_length"}


def test_a_rewritten_pair_decodes_the_original_graphs_greedy_text_for_every_k_and_drafter(
    rewritten: Path, original: Path
) -> None:
    want = Pipeline.load(original).generate(PROMPT, max_new_tokens=60, k=0).token_ids
    pipe = Pipeline.load(rewritten)
    assert pipe.generate(PROMPT, max_new_tokens=60, k=0).token_ids == want
    for k, drafter in ((1, "draft"), (3, "draft"), (6, "draft"), ("auto", "draft"),
                       (5, "suffix"), (4, "ngram+draft")):  # fmt: skip
        result = pipe.generate(PROMPT, max_new_tokens=60, k=k, drafter=drafter)
        assert result.token_ids == want, (k, drafter)
    stats = pipe.generate(PROMPT, max_new_tokens=60, k=3, drafter="draft").stats
    assert 0 < stats.accepted < stats.proposed  # rollbacks happened, and so did acceptance


def test_seeded_sampling_on_a_rewritten_pair_gives_one_text_for_every_k(rewritten: Path) -> None:
    pipe = Pipeline.load(rewritten)
    runs = [
        pipe.generate(PROMPT, max_new_tokens=40, k=k, temperature=0.8, seed=5).token_ids
        for k in (0, 2, 5)
    ]
    assert runs[0] == runs[1] == runs[2]


def test_biased_projections_rewrite_through_the_cli(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    """qwen2's q/k/v projections add a bias: the rewrite reads it as part of the projection."""
    out, plain = tmp_path / "qwen2-gqa", tmp_path / "qwen2"
    folder = str(optimum_folders["qwen2"])
    done = subprocess.run(
        [sys.executable, "-m", "specx.apps.cli.main", "import", "--target", folder, "--draft",
         "ngram", "--rewrite", "gqa", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rewritten as GroupQueryAttention" in done.stderr
    import_pair(optimum_folders["qwen2"], ["ngram"], plain, ImportOptions(), lambda _: None)
    want = Pipeline.load(plain).generate(PROMPT + PROMPT, max_new_tokens=40, k=0).token_ids
    pipe = Pipeline.load(out)
    assert pipe.generate(PROMPT + PROMPT, max_new_tokens=40, k=0).token_ids == want
    assert pipe.generate(PROMPT + PROMPT, max_new_tokens=40, k=4).token_ids == want


def test_a_rewrite_that_parts_from_the_original_is_refused_and_nothing_is_written(
    optimum_folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a wrong softmax scale is caught by the comparison with the original."""
    scale_of = rewrite._scale_of
    monkeypatch.setattr(rewrite, "_scale_of", lambda g, node: 1.5 * scale_of(g, node))
    out = tmp_path / "wrong"
    with pytest.raises(InputError, match="parts from") as refused:
        import_pair(optimum_folders["target"], [], out, REWRITE, lambda _: None)
    assert "without --rewrite" in str(refused.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_reference_consumer_and_libspecx_reproduce_specx_on_a_rewritten_pair(
    rewritten: Path,
) -> None:
    from libspecx_tools import Library

    prompt = list(range(5, 40))
    pipeline = Pipeline.load(rewritten)
    consumer = reference_consumer()
    model = Library().load(rewritten)
    try:
        for drafter, k in (("draft", 3), ("suffix", 5)):
            want = pipeline.generate(
                prompt, max_new_tokens=120, k=k, drafter=drafter, cache_scope=None
            )
            got = consumer.generate(rewritten, prompt, 120, drafter, k, None)
            assert got["token_ids"] == want.token_ids, drafter
            assert got["accepted"] == want.stats.accepted, drafter
            native = model.generate(prompt, 120, k, drafter)
            assert native.tokens == want.token_ids, drafter
            assert native.stats["accepted"] == want.stats.accepted, drafter
    finally:
        model.close()


def test_a_sliding_window_attention_is_not_rewritten(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    """GroupQueryAttention here attends to every position: a model whose config slides its
    attention over fewer positions than the cache holds is refused, not rewritten wrongly."""
    import shutil

    folder = tmp_path / "windowed"
    shutil.copytree(optimum_folders["qwen2"], folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0}
    config.pop("layer_types", None)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="slides over 64 positions"):
        import_pair(folder, [], tmp_path / "out", REWRITE, lambda _: None)
    assert not (tmp_path / "out").exists()


def test_an_onnx_community_q4_variant_imports_and_rewrites_with_its_int4_projections(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    """The q4 variant as onnx-community makes it (ONNX Runtime's MatMulNBits quantizer over
    Optimum's graph): imported as it is and rewritten, the same greedy text from both, and with
    speculation."""
    import shutil

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    source = optimum_folders["target"]
    community = tmp_path / "community"
    (community / "onnx").mkdir(parents=True)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(source / f, community / f)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(source / "model.onnx")), block_size=32)
    quantizer.process()
    quantizer.model.save_model_to_file(str(community / "onnx" / "model_q4.onnx"), False)
    texts = []
    for name, options in (("plain", ImportOptions(variant="q4")),
                          ("gqa", ImportOptions(variant="q4", rewrite="gqa"))):  # fmt: skip
        manifest = import_pair(community, ["ngram"], tmp_path / name, options, lambda _: None)
        assert manifest.target.variant == "q4"
        pipe = Pipeline.load(tmp_path / name)
        alone = pipe.generate(PROMPT, max_new_tokens=60, k=0).token_ids
        assert pipe.generate(PROMPT, max_new_tokens=60, k=4).token_ids == alone, name
        texts.append(alone)
    graph = onnx.load(str(tmp_path / "gqa" / "target" / "model_q4.onnx"), load_external_data=False)
    ops = {n.op_type for n in graph.graph.node}
    assert {"MatMulNBits", "GroupQueryAttention"} <= ops and "Softmax" not in ops
    assert texts[0] == texts[1]


def test_external_data_is_linked_where_onnx_runtime_reads_it_and_every_reader_loads_it(
    optimum_folders: dict[str, Path], tmp_path: Path
) -> None:
    """Weights in model.onnx_data (Optimum's layout for large models): the graph as exported is
    linked with its data (symbolic links, resolved together); a rewritten graph, a new file,
    gets its data hard-linked beside it (ONNX Runtime refuses data a symbolic link leads out of
    the graph's folder) or copied with --copy."""
    import shutil

    import onnx
    from libspecx_tools import Library

    folder = tmp_path / "external"
    folder.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(optimum_folders["qwen2"] / f, folder / f)
    model = onnx.load(str(optimum_folders["qwen2"] / "model.onnx"))
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True,
              location="model.onnx_data", size_threshold=0)  # fmt: skip
    texts = []
    for name, options in (("plain", ImportOptions()), ("gqa", REWRITE),
                          ("copied", ImportOptions(rewrite="gqa", copy=True))):  # fmt: skip
        import_pair(folder, ["ngram"], tmp_path / name, options, lambda _: None)
        data = tmp_path / name / "target" / "model.onnx_data"
        assert data.is_symlink() == (name == "plain")
        assert data.stat().st_nlink == (2 if name == "gqa" else 1)
        texts.append(Pipeline.load(tmp_path / name).generate(PROMPT, max_new_tokens=30, k=0))
        native = Library().load(tmp_path / name)
        try:
            got = native.generate(texts[-1].prompt_token_ids, 30, 0, "ngram").tokens
            assert got == texts[-1].token_ids, name
        finally:
            native.close()
    assert texts[0].token_ids == texts[1].token_ids == texts[2].token_ids

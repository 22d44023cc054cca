"""`specx import` of ONNX Runtime GenAI builder folders (the real tool, tests/genai_models.py):
its shared-buffer GroupQueryAttention graphs run speculatively with the runtime alone, from C,
and from the format document's reference consumer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from genai_models import genai_folder, needs_genai
from optimum_models import OPTIMUM_PYTHON, optimum_folder

from reference import reference_consumer
from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline
from specx.runtime.errors import InputError

pytestmark = needs_genai
PROMPT = list(range(5, 40))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("genai")
    return {"target": genai_folder(root, seed=0), "draft": genai_folder(root, seed=0, noise=0.3)}


@pytest.fixture(scope="module")
def pair(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "pair"
    import_pair(folders["target"], [str(folders["draft"])], out, ImportOptions(), lambda _: None)
    return out


def test_a_genai_pair_decodes_greedy_as_its_target_alone(pair: Path) -> None:
    manifest = json.loads((pair / "manifest.json").read_text())
    assert manifest["target"]["attention"] == manifest["drafts"][0]["attention"] == "genai"
    assert manifest["target"]["parity"]["argmax_agreement"] == 1.0
    pipe = Pipeline.load(pair)
    alone = pipe.generate(PROMPT, max_new_tokens=80, k=0)
    for k, drafter in ((1, "draft"), (3, "draft"), ("auto", "draft"), (4, "ngram+draft")):
        result = pipe.generate(PROMPT, max_new_tokens=80, k=k, drafter=drafter)
        assert result.token_ids == alone.token_ids, (k, drafter)
    stats = pipe.generate(PROMPT, max_new_tokens=80, k=3, drafter="draft").stats
    assert 0 < stats.accepted < stats.proposed  # rollbacks happened, and so did acceptance


def test_libspecx_and_the_reference_consumer_give_the_python_runtimes_ids(pair: Path) -> None:
    from libspecx_tools import Library

    consumer = reference_consumer()
    model = Library().load(pair)
    pipe = Pipeline.load(pair)
    try:
        for drafter, k in (("draft", 3), ("suffix+draft", 4), ("none", 0)):
            want = pipe.generate(PROMPT, max_new_tokens=64, k=k, drafter=drafter, cache_scope=None)
            assert model.generate(PROMPT, 64, k, drafter).tokens == want.token_ids, drafter
            got = consumer.generate(pair, PROMPT, 64, drafter, k, None)
            assert got["token_ids"] == want.token_ids, drafter
            assert (got["proposed"], got["accepted"]) == (want.stats.proposed, want.stats.accepted)
    finally:
        model.close()


def test_a_genai_graph_that_does_not_share_its_buffer_is_refused(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "unshared"
    shutil.copytree(folders["target"], copy)
    config = json.loads((copy / "genai_config.json").read_text())
    config["search"]["past_present_share_buffer"] = False
    (copy / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="past_present_share_buffer"):
        import_pair(copy, [], tmp_path / "out", ImportOptions(), lambda _: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not OPTIMUM_PYTHON, reason="SPECX_OPTIMUM_PYTHON is not set")
def test_an_optimum_target_takes_a_genai_draft(folders: dict[str, Path], tmp_path: Path) -> None:
    """Layouts mix: each model keeps its own; the pair shares the tokenizer."""
    target = optimum_folder(tmp_path, "llama", seed=0)
    out = tmp_path / "mixed"
    manifest = import_pair(target, [str(folders["draft"])], out, ImportOptions(), lambda _: None)
    assert (manifest.target.attention, manifest.drafts[0].attention) == ("concat", "genai")
    pipe = Pipeline.load(out)
    alone = pipe.generate(PROMPT, max_new_tokens=40, k=0).token_ids
    assert pipe.generate(PROMPT, max_new_tokens=40, k=3, drafter="draft").token_ids == alone


def test_a_second_family_and_an_int4_build_import_and_decode_exactly(tmp_path: Path) -> None:
    """GenAI's qwen2 build as the target, its int4 build (MatMulNBits) of the same model as the
    draft: the text is the target alone's, and some of the int4 draft's tokens pass."""
    target = genai_folder(tmp_path, seed=2, family="qwen2")
    draft = genai_folder(tmp_path, seed=2, family="qwen2", precision="int4")
    out = tmp_path / "pair"
    manifest = import_pair(target, [f"int4={draft}"], out, ImportOptions(), lambda _: None)
    assert manifest.target.architecture == "qwen2" and manifest.drafts[0].variant == "genai"
    pipe = Pipeline.load(out)
    alone = pipe.generate(PROMPT, max_new_tokens=60, k=0)
    drafted = pipe.generate(PROMPT, max_new_tokens=60, k=3, drafter="int4")
    assert drafted.token_ids == alone.token_ids
    assert drafted.stats.accepted > 0  # (a random model: int4 rounding moves many argmaxes)


def test_genai_s_fp16_cpu_build_is_refused_naming_why(tmp_path: Path) -> None:
    folder = genai_folder(tmp_path, precision="fp16")  # does not share its buffer on the CPU
    with pytest.raises(InputError, match="past_present_share_buffer"):
        import_pair(folder, [], tmp_path / "out", ImportOptions(), lambda _: None)

"""`specx import --draft NAME=ARTIFACT`: a target exported by Optimum (the real tool) drafted by
a draft that `specx export` made from the same model's weights, taken as that export wrote it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optimum_models import needs_optimum

from reference import reference_consumer
from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline
from specx.runtime.artifact.contract import Manifest
from specx.runtime.errors import ArtifactError, InputError

pytestmark = needs_optimum
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n"


@pytest.fixture(scope="module")
def exported(optimum_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """specx's export of the Optimum target's own Hugging Face folder, with int8 and int4
    drafts made from its weights."""
    from specx.exporter import ExportOptions, export_pair

    source = optimum_folders["target"].parent / f"{optimum_folders['target'].name}-hf"
    out = tmp_path_factory.mktemp("exported") / "artifact"
    export_pair(str(source), ["int8", "int4"], out, ExportOptions(max_length=256), print)
    return out


@pytest.fixture(scope="module")
def pair(
    optimum_folders: dict[str, Path], exported: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("borrowed") / "pair"
    drafts = [f"int8={exported}", "suffix"]
    import_pair(optimum_folders["target"], drafts, out, ImportOptions(), print)
    return out


def test_the_borrowed_draft_keeps_its_export_s_id_and_parity(pair: Path, exported: Path) -> None:
    manifest, source = Manifest.read(pair), Manifest.read(exported)
    draft = manifest.find_draft("int8")
    assert draft.graph == "int8/int8.onnx"
    assert draft.pair_id == source.pair_id != manifest.pair_id
    assert manifest.target.pair_id is None  # the imported target is this artifact's own
    assert draft.parity["export"] == source.find_draft("int8").parity
    assert draft.parity["argmax_agreement"] == 1.0
    assert (
        json.loads((pair / "manifest.json").read_text())["exporter"]["layouts"]["int8"] == "specx"
    )


def test_an_optimum_target_with_a_specx_draft_decodes_greedy_as_its_target_alone(
    pair: Path,
) -> None:
    pipe = Pipeline.load(pair)
    alone = pipe.generate(PROMPT, max_new_tokens=60, k=0)
    for k in (1, 3, 6, "auto"):
        result = pipe.generate(PROMPT, max_new_tokens=60, k=k, drafter="int8")
        assert result.token_ids == alone.token_ids, k
    stats = pipe.generate(PROMPT, max_new_tokens=60, k=4, drafter="suffix+int8").stats
    assert stats.accepted > 0.8 * stats.proposed  # the same weights, quantized: it agrees
    seeded = [
        pipe.generate(PROMPT, max_new_tokens=40, k=k, drafter="int8", temperature=0.8, seed=3)
        for k in (0, 3)
    ]
    assert seeded[0].token_ids == seeded[1].token_ids


def test_the_c_library_and_the_reference_consumer_give_the_same_tokens(pair: Path) -> None:
    from libspecx_tools import K_AUTO, Library

    pipeline = Pipeline.load(pair)
    prompt = list(range(5, 40))
    model = Library().load(pair)
    try:
        for k in (3, K_AUTO):
            got = model.generate(prompt, 80, k, "int8")
            want = pipeline.generate(prompt, k="auto" if k == K_AUTO else k, drafter="int8",
                                     max_new_tokens=80)  # fmt: skip
            assert got.tokens == want.token_ids, k
    finally:
        model.close()
    options = dict(max_new_tokens=80, k=3, drafter="int8", cache_scope=None)
    want = pipeline.generate(prompt, **options)
    got = reference_consumer().generate(pair, prompt, 80, "int8", 3, None)
    assert got["token_ids"] == want.token_ids
    assert (got["proposed"], got["accepted"]) == (want.stats.proposed, want.stats.accepted)


def test_a_draft_graph_of_another_export_than_its_spec_says_is_refused(
    pair: Path, tmp_path: Path
) -> None:
    """Negative control: the same artifact with the draft's recorded export dropped (so the
    manifest's own is expected) is refused by Python and C alike, naming the mix."""
    from libspecx_tools import Library, SpecxError

    bad = tmp_path / "bad"
    bad.mkdir()
    for f in pair.iterdir():
        (bad / f.name).symlink_to(f.resolve(), target_is_directory=f.is_dir())
    data = json.loads((pair / "manifest.json").read_text())
    del data["drafts"][0]["pair_id"]
    (bad / "manifest.json").unlink()
    (bad / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="different exports are mixed"):
        Pipeline.load(bad).generate(PROMPT, max_new_tokens=8, k=3, drafter="int8")
    model = Library().load(bad)
    try:
        with pytest.raises(SpecxError, match="another export"):
            model.generate([5, 6, 7], 8, 3, "int8")
    finally:
        model.close()


def test_a_name_picks_a_draft_else_the_default_and_an_unpicked_one_is_refused(
    optimum_folders: dict[str, Path], exported: Path, tmp_path: Path
) -> None:
    """NAME picks the artifact's draft of that name, else its default drafter if that is a
    model; where neither does (the default a lookup), the import stops listing the drafts."""
    target = optimum_folders["target"]
    picked = import_pair(target, [f"int4={exported}"], tmp_path / "a", ImportOptions(), print)
    assert picked.drafts[0].variant == "int4"
    default = import_pair(target, [f"fast={exported}"], tmp_path / "b", ImportOptions(), print)
    assert default.drafts[0].name == "fast" and default.drafts[0].variant == "int8"
    lookup = tmp_path / "lookup-default"
    lookup.mkdir()
    for f in exported.iterdir():
        if f.name != "manifest.json":
            (lookup / f.name).symlink_to(f.resolve())
    data = json.loads((exported / "manifest.json").read_text())
    (lookup / "manifest.json").write_text(json.dumps({**data, "default_drafter": "ngram"}))
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"model drafts are \['int4', 'int8'\]") as e:
        import_pair(target, [f"fast={lookup}"], out, ImportOptions(), print)
    assert "NAME one of its model drafts" in (e.value.hint or "")
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_a_draft_borrowed_from_an_import_keeps_the_export_it_came_from(
    optimum_folders: dict[str, Path], pair: Path, exported: Path, tmp_path: Path
) -> None:
    """Borrowed again from the import (its graph one folder deep there): the id is still the
    first export's, and it decodes as the target alone."""
    out = tmp_path / "again"
    manifest = import_pair(optimum_folders["target"], [f"int8={pair}"], out, ImportOptions(), print)
    assert manifest.drafts[0].pair_id == Manifest.read(exported).pair_id
    pipe = Pipeline.load(out)
    alone = pipe.generate(PROMPT, max_new_tokens=30, k=0).token_ids
    assert pipe.generate(PROMPT, max_new_tokens=30, k=3, drafter="int8").token_ids == alone

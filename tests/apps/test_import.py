"""`specx import`: artifacts from decoder folders made by Hugging Face Optimum's exporter (the
real tool, tests/optimum_models.py), run speculatively with the runtime alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optimum_models import needs_optimum, optimum_folder

from reference import reference_consumer
from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline
from specx.runtime.concat_cache import ConcatCache
from specx.runtime.errors import InputError

pytestmark = needs_optimum
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n"


@pytest.fixture(scope="module")
def folders(optimum_folders: dict[str, Path]) -> dict[str, Path]:
    return optimum_folders


@pytest.fixture(scope="module")
def pair(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "pair"
    import_pair(folders["target"], [str(folders["draft"])], out, ImportOptions(), lambda _: None)
    return out


def test_an_optimum_pair_decodes_greedy_as_its_target_alone_for_every_k_and_drafter(
    pair: Path,
) -> None:
    pipe = Pipeline.load(pair)
    alone = pipe.generate(PROMPT, max_new_tokens=60, k=0)
    assert len(alone.token_ids) == 60
    for k, drafter in ((1, "draft"), (3, "draft"), (6, "draft"), ("auto", "draft"), (4, "ngram")):
        result = pipe.generate(PROMPT, max_new_tokens=60, k=k, drafter=drafter)
        assert result.token_ids == alone.token_ids, (k, drafter)
    drafted = pipe.generate(PROMPT, max_new_tokens=60, k=3, drafter="draft").stats
    assert 0 < drafted.accepted < drafted.proposed  # rollbacks happened, and so did acceptance


def test_seeded_sampling_gives_one_text_for_every_k(pair: Path) -> None:
    pipe = Pipeline.load(pair)
    runs = [
        pipe.generate(PROMPT, max_new_tokens=40, k=k, temperature=0.8, seed=5).token_ids
        for k in (0, 2, 5)
    ]
    assert runs[0] == runs[1] == runs[2]
    other = pipe.generate(PROMPT, max_new_tokens=40, k=2, temperature=0.8, seed=6).token_ids
    assert other != runs[0]  # the seed decides the text


def test_rolled_back_slots_are_masked_and_compacted_without_changing_a_logit(pair: Path) -> None:
    pipe = Pipeline.load(pair)
    session = pipe.target
    cache = session.new_cache(256)
    assert isinstance(cache, ConcatCache)
    rng = np.random.default_rng(0)
    held: list[int] = []
    for _ in range(60):  # verify-like passes of 1..6 tokens, each rolled back by some
        tokens = rng.integers(3, 300, int(rng.integers(1, 7)))
        session.forward(tokens, cache)
        keep = int(rng.integers(1, len(tokens) + 1))
        cache.truncate(len(held) + keep)
        held += tokens[:keep].tolist()
    assert cache.compactions > 0 and cache.slots - cache.length < 64
    probe = np.array([7, 11, 13], dtype=np.int64)
    logits = session.forward(probe, cache).copy()
    fresh = session.new_cache(256)
    session.prefill(np.array(held, dtype=np.int64), fresh)
    clean = session.forward(probe, fresh).copy()
    assert np.abs(logits - clean).max() < 1e-4
    assert (logits.argmax(-1) == clean.argmax(-1)).all()


def test_unmasked_holes_would_change_the_text(pair: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a cache that forgets to mask rolled-back slots is caught."""
    pipe = Pipeline.load(pair)
    alone = pipe.generate(PROMPT, max_new_tokens=60, k=0).token_ids
    monkeypatch.setattr(
        ConcatCache, "truncate", lambda self, n, row=0: self.lengths.__setitem__(row, n)
    )
    broken = Pipeline.load(pair).generate(PROMPT, max_new_tokens=60, k=4, drafter="draft")
    assert broken.token_ids != alone


def test_a_second_family_and_a_model_free_drafter_import(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "qwen2"
    manifest = import_pair(folders["qwen2"], ["ngram"], out, ImportOptions(), lambda _: None)
    assert manifest.default_drafter == "ngram" and not manifest.drafts
    assert manifest.target.architecture == "qwen2" and manifest.target.attention == "concat"
    parity = manifest.target.parity
    assert parity["argmax_agreement"] == 1.0 and parity["max_abs_logit_diff"] < 1e-4
    assert parity["after_rollback_max_abs_logit_diff"] < 1e-5  # masked slots: rounding only
    pipe = Pipeline.load(out)
    alone = pipe.generate(PROMPT + PROMPT, max_new_tokens=40, k=0).token_ids
    assert pipe.generate(PROMPT + PROMPT, max_new_tokens=40, k=4).token_ids == alone
    data = json.loads((out / "manifest.json").read_text())
    assert data["format_version"] == 3 and data["exporter"]["graphs"] == "linked"
    assert (out / "target" / "model.onnx").is_symlink()


def test_copied_graphs_stand_alone(folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "copied"
    import_pair(folders["qwen2"], [], out, ImportOptions(copy=True), lambda _: None)
    assert not (out / "target" / "model.onnx").is_symlink()
    assert len(Pipeline.load(out).generate(PROMPT, max_new_tokens=8, k=0).token_ids) == 8


def test_a_graph_without_a_cache_is_refused_naming_the_fix(tmp_path: Path) -> None:
    folder = optimum_folder(tmp_path, "llama", past=False)
    with pytest.raises(InputError) as e:
        import_pair(folder, [], tmp_path / "out", ImportOptions(), lambda _: None)
    assert "no past_key_values" in e.value.message and "text-generation-with-past" in (
        e.value.hint or ""
    )
    assert not (tmp_path / "out").exists()


def test_bad_inputs_are_refused_before_anything_is_written(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cases = [
        (folders["target"], [str(tmp_path / "missing")], "is not a folder"),
        (folders["target"], ["int8"], "does not have"),
        (tmp_path / "nothing", [], "is not a folder"),
    ]
    genai = tmp_path / "genai"
    genai.mkdir()
    (genai / "genai_config.json").write_text("{}")
    cases.append((genai, [], "cannot read"))
    for target, drafts, words in cases:
        with pytest.raises(InputError) as e:
            import_pair(target, drafts, out, ImportOptions(), lambda _: None)
        assert words in e.value.message, e.value.message
    with pytest.raises(InputError, match="variant"):
        import_pair(folders["target"], [], out, ImportOptions(variant="q4"), lambda _: None)
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    out.mkdir()
    with pytest.raises(InputError, match="--force"):
        import_pair(folders["target"], [], out, ImportOptions(), lambda _: None)


def test_a_draft_with_another_tokenizer_is_refused_naming_the_first_differing_id(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    from tiny_models import build_tokenizer

    other = tmp_path / "other"
    other.mkdir()
    for f in folders["draft"].iterdir():
        (other / f.name).symlink_to(f)
    (other / "tokenizer.json").unlink()
    build_tokenizer(vocab_size=300).save(str(other / "tokenizer.json"))
    with pytest.raises(InputError, match="token id"):
        import_pair(folders["target"], [str(other)], tmp_path / "out", ImportOptions(), print)


def test_the_cli_imports_with_the_runtime_alone_and_exits_2_on_bad_input(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    code = (
        "import sys; from specx.apps.cli.main import main; sys.argv = ['specx'] + sys.argv[1:];"
        "\ntry: main()\nexcept SystemExit as e: code = e.code\n"
        "print('TORCH' if 'torch' in sys.modules or 'transformers' in sys.modules else 'CLEAN');"
        "sys.exit(code)"
    )
    args = ["import", "--target", str(folders["qwen2"]), "--draft", "ngram"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args, "-o", str(tmp_path / "a")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "CLEAN"
    bad = subprocess.run(
        [sys.executable, "-m", "specx.apps.cli.main", "import", "--target", str(tmp_path / "x"),
         "-o", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2 and "is not a folder" in bad.stderr


@pytest.mark.parametrize(
    ("drafter", "k", "sampling"),
    [("draft", 3, None), ("ngram+draft", 4, None), ("suffix", 5, None), ("draft", 3, "seeded")],
)
def test_the_reference_consumer_reproduces_specx_on_an_imported_pair(
    pair: Path, drafter: str, k: int, sampling: str | None
) -> None:
    """reference/consumer.py, written from docs/artifact-format.md alone, gives specx's tokens and
    acceptance counts on the concat layout, holes and compactions included."""
    consumer = reference_consumer()
    params = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.0, "seed": 7}
    options = dict(max_new_tokens=150, k=k, drafter=drafter, cache_scope=None)
    if sampling:
        options.update(params)
    prompt = list(range(5, 40))
    want = Pipeline.load(pair).generate(prompt, **options)
    got = consumer.generate(pair, prompt, 150, drafter, k, params if sampling else None)
    assert got["token_ids"] == want.token_ids
    assert (got["proposed"], got["accepted"]) == (want.stats.proposed, want.stats.accepted)


def test_libspecx_gives_the_python_runtimes_ids_and_counts_on_an_imported_pair(pair: Path) -> None:
    """The C library runs the concat layout too (holes, compactions), token for token."""
    from libspecx_tools import K_AUTO, Library

    model = Library().load(pair)
    pipeline = Pipeline.load(pair)
    try:
        for prompt in ([5, 9, 12], list(range(5, 45))):
            for name in model.drafters:
                for k in [0] if name == "none" else [1, 4, K_AUTO]:
                    got = model.generate(prompt, 120, k, name)
                    py_k = "auto" if k == K_AUTO else k
                    want = pipeline.generate(prompt, k=py_k, drafter=name, max_new_tokens=120)
                    where = f"{name}, K={py_k}, prompt of {len(prompt)}"
                    assert got.tokens == want.token_ids, where
                    if k != K_AUTO:
                        stats = want.stats
                        assert got.stats["target_passes"] == stats.target_passes, where
                        assert got.stats["accepted"] == stats.accepted, where
                        assert got.stats["proposed"] == stats.proposed, where
    finally:
        model.close()


def test_specx_serve_answers_from_an_imported_pair_and_reuses_its_prompt(pair: Path) -> None:
    """The second turn of a conversation keeps what the imported graph's cache holds of the first
    (the truncation to the shared prefix leaves holes) and says so; its text is the same as
    with reuse off."""
    from serve_tools import MODEL, client, serving
    from specx.runtime.prefix import PrefixConfig

    first = [{"role": "user", "content": "def fib(n):"}]

    def conversation(base: str) -> list[Any]:
        api = client(base)
        one = api.chat.completions.create(model=MODEL, messages=first, max_tokens=24, temperature=0)
        later = [*first, {"role": "assistant", "content": one.choices[0].message.content},
                 {"role": "user", "content": "again"}]  # fmt: skip
        two = api.chat.completions.create(model=MODEL, messages=later, max_tokens=24, temperature=0)
        return [one, two]

    with serving(pair) as (base, _server, _pipe):
        warm = conversation(base)
    with serving(pair, prefix=PrefixConfig(reuse=False)) as (base, _server, _pipe):
        cold = conversation(base)
    # at least the first prompt (a random model's answer need not re-tokenize to its own ids)
    assert warm[1].usage.prompt_tokens_details.cached_tokens >= warm[0].usage.prompt_tokens - 3
    assert cold[1].usage.prompt_tokens_details.cached_tokens == 0
    assert [r.choices[0].message.content for r in warm] == [
        r.choices[0].message.content for r in cold
    ]


def test_a_variant_is_picked_from_an_onnx_community_folder(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """onnx/model.onnx and onnx/model_<variant>.onnx beside config.json and tokenizer.json (the
    onnx-community layout): model.onnx by default, another with --variant."""
    community = tmp_path / "community"
    (community / "onnx").mkdir(parents=True)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(folders["target"] / f, community / f)
    shutil.copy2(folders["target"] / "model.onnx", community / "onnx" / "model.onnx")
    shutil.copy2(folders["qwen2"] / "model.onnx", community / "onnx" / "model_other.onnx")
    plain = import_pair(community, [], tmp_path / "a", ImportOptions(), lambda _: None)
    other = import_pair(community, [], tmp_path / "b", ImportOptions(variant="other"), print)
    assert (plain.target.variant, plain.target.graph) == ("fp32", "target/model.onnx")
    assert (other.target.variant, other.target.graph) == ("other", "target/model_other.onnx")
    assert Pipeline.load(tmp_path / "b").generate(PROMPT, max_new_tokens=4, k=0).token_ids


def test_an_fp16_variant_imports_and_every_reader_gives_the_same_tokens(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """onnx-community's fp16 variant (ONNX Runtime's float16 converter over Optimum's graph):
    fp16 caches and logits, read as float32 exactly by the runtime, libspecx and the consumer."""
    import onnx
    from libspecx_tools import Library
    from onnxruntime.transformers.float16 import convert_float_to_float16

    community = tmp_path / "community"
    (community / "onnx").mkdir(parents=True)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(folders["target"] / f, community / f)
    graph = onnx.load(folders["target"] / "model.onnx")
    half = convert_float_to_float16(graph, keep_io_types=False)
    onnx.save(half, community / "onnx" / "model_fp16.onnx")
    out = tmp_path / "fp16"
    manifest = import_pair(community, ["suffix"], out, ImportOptions(variant="fp16"), print)
    assert manifest.target.dtype == "float16" and manifest.target.logits_dtype == "float16"
    pipe = Pipeline.load(out)
    alone = pipe.generate(PROMPT, max_new_tokens=48, k=0, cache_scope=None)
    drafted = pipe.generate(PROMPT, max_new_tokens=48, k=4, cache_scope=None)
    assert drafted.token_ids == alone.token_ids
    model = Library().load(out)
    try:
        assert model.generate(list(pipe.encode_prompt(PROMPT)), 48, 4, "suffix").tokens == (
            drafted.token_ids
        )
    finally:
        model.close()
    consumer = reference_consumer()
    got = consumer.generate(out, list(pipe.encode_prompt(PROMPT)), 48, "suffix", 4, None)
    assert got["token_ids"] == drafted.token_ids


def test_a_q4f16_variant_imports_and_decodes_speculatively_as_its_target_alone(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """onnx-community's q4f16 variant: ONNX Runtime's float16 converter, then its MatMulNBits
    quantizer, over Optimum's graph (fp16 caches and logits, int4 projections)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.transformers.float16 import convert_float_to_float16

    community = tmp_path / "community"
    (community / "onnx").mkdir(parents=True)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(folders["qwen2"] / f, community / f)
    half = convert_float_to_float16(onnx.load(str(folders["qwen2"] / "model.onnx")))
    quantizer = MatMulNBitsQuantizer(half, block_size=32)
    quantizer.process()
    quantizer.model.save_model_to_file(str(community / "onnx" / "model_q4f16.onnx"), False)
    options = ImportOptions(variant="q4f16")
    manifest = import_pair(community, ["ngram"], tmp_path / "art", options, lambda _: None)
    assert (manifest.target.variant, manifest.target.dtype) == ("q4f16", "float16")
    assert manifest.target.parity["argmax_agreement"] == 1.0
    pipe = Pipeline.load(tmp_path / "art")
    alone = pipe.generate(PROMPT + PROMPT, max_new_tokens=40, k=0).token_ids
    for k in (1, 4, "auto"):
        assert pipe.generate(PROMPT + PROMPT, max_new_tokens=40, k=k).token_ids == alone, k

"""libspecx on the real models: SmolLM2 (fp32 target, int8 draft, n-gram) and the Qwen2.5-Coder
int4 pair on the specx kernels (the manifest names the kernels library; libspecx registers the
one beside it). Greedy C ids equal the Python runtime's, pass for pass, for each drafter and K.
Runs where the test command fetched the models (scripts/test.sh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from libspecx_tools import K_AUTO, Library, library_path

from conftest import needs_exporter
from specx.runtime import Pipeline

pytestmark = [needs_exporter, pytest.mark.slow]
PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in two sentences what a hash map is.",
)


def assert_same_as_python(
    artifact: Path, runs: list[tuple[str, int]], new_tokens: int, **sampling: Any
) -> None:
    if not library_path().is_file():
        pytest.skip("libspecx is not built (scripts/build_libspecx.sh)")
    model = Library().load(artifact)
    pipeline = Pipeline.load(artifact)
    try:
        for text in PROMPTS:
            prompt = pipeline.encode_prompt(text, chat=True).tolist()
            for name, k in runs:
                got = model.generate(prompt, new_tokens, k, name, **sampling)
                py_k = "auto" if k == K_AUTO else k
                want = pipeline.generate(  # cold, as the C generation in a context of its own
                    prompt,
                    k=py_k,
                    drafter=name,
                    max_new_tokens=new_tokens,
                    cache_scope=None,
                    **sampling,
                )
                where = f"{name}, K={py_k}: {text!r}"
                assert got.tokens == want.token_ids, where
                if k == K_AUTO or sampling:
                    continue  # K auto follows measured times; a sampled step may accept less
                assert got.stats["target_passes"] == want.stats.target_passes, where
                assert got.stats["accepted"] == want.stats.accepted, where
                if k:
                    assert got.stats["accepted"] > 0, where  # the drafts are useful, not ignored
    finally:
        model.close()


def test_c_equals_python_on_smollm2(smollm2_artifact: Path) -> None:
    runs = [("none", 0), ("int8", 1), ("int8", 4), ("int8", K_AUTO), ("ngram", 4)]
    runs += [("ngram+int8", 4), ("ngram+int8", K_AUTO)]
    assert_same_as_python(smollm2_artifact, runs, 48)


def test_a_seed_gives_the_python_runtimes_text_on_smollm2(smollm2_artifact: Path) -> None:
    runs = [("none", 0), ("int8", 4), ("ngram+int8", K_AUTO)]
    assert_same_as_python(smollm2_artifact, runs, 48, temperature=0.7, top_p=0.9, seed=7)


def test_c_equals_python_on_the_qwen_int4_pair_on_the_specx_kernels(qwen_artifact: Path) -> None:
    import json

    manifest = json.loads((qwen_artifact / "manifest.json").read_text())
    assert manifest["target"].get("op_libraries"), "the pair runs on the specx kernels"
    draft = manifest["drafts"][0]["name"]
    runs = [("none", 0), (draft, 1), (draft, 4), (draft, K_AUTO), ("ngram", 4)]
    assert_same_as_python(qwen_artifact, runs, 32)


def test_streamed_text_equals_the_tokenizers_decode_on_smollm2_and_qwen(
    smollm2_artifact: Path, qwen_artifact: Path
) -> None:
    from test_libspecx_text import check_tokenizer

    if not library_path().is_file():
        pytest.skip("libspecx is not built (scripts/build_libspecx.sh)")
    for artifact in (smollm2_artifact, qwen_artifact):
        check_tokenizer(Library(), artifact, samples=300, length=32)

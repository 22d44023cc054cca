"""Bad artifacts, bad run options, long runs, reuse and threads, through the Python API."""

from __future__ import annotations

import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import ArtifactError, InputError, Pipeline

pytestmark = needs_exporter


def broken_copy(pair: TinyPair, tmp_path: Path) -> Path:
    folder = tmp_path / "artifact"
    shutil.copytree(pair.artifact, folder)
    return folder


def edit_manifest(folder: Path, change: Any) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# -- artifacts ------------------------------------------------------------------------------


def test_a_missing_graph_file_is_named(llama_pair: TinyPair, tmp_path: Path) -> None:
    folder = broken_copy(llama_pair, tmp_path)
    (folder / "target.onnx").unlink()
    with pytest.raises(ArtifactError, match=r"graph file .*target.onnx is missing"):
        Pipeline.load(folder)


def test_a_missing_tokenizer_is_named(llama_pair: TinyPair, tmp_path: Path) -> None:
    folder = broken_copy(llama_pair, tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match=r"tokenizer file .*tokenizer.json is missing"):
        Pipeline.load(folder)


def test_a_manifest_from_a_newer_format_is_refused(llama_pair: TinyPair, tmp_path: Path) -> None:
    folder = broken_copy(llama_pair, tmp_path)
    edit_manifest(folder, lambda d: d.update(format_version=99))
    with pytest.raises(ArtifactError, match="format version 99, newer than this specx"):
        Pipeline.load(folder)


@pytest.mark.parametrize("field", ["pair_id", "target", "max_length"])
def test_a_manifest_with_fields_missing_is_refused(
    llama_pair: TinyPair, tmp_path: Path, field: str
) -> None:
    folder = broken_copy(llama_pair, tmp_path)
    edit_manifest(folder, lambda d: d.pop(field))
    with pytest.raises(ArtifactError, match=f"lacks the field.*{field}"):
        Pipeline.load(folder)


def test_a_manifest_that_is_not_json_is_refused(llama_pair: TinyPair, tmp_path: Path) -> None:
    folder = broken_copy(llama_pair, tmp_path)
    (folder / "manifest.json").write_text("{ not json")
    with pytest.raises(ArtifactError, match="cannot be read as JSON"):
        Pipeline.load(folder)


def test_graphs_whose_io_do_not_match_the_manifest_are_refused(
    llama_pair: TinyPair, tmp_path: Path
) -> None:
    folder = broken_copy(llama_pair, tmp_path)

    def one_more_layer(data: dict[str, Any]) -> None:
        data["target"]["num_layers"] += 1

    edit_manifest(folder, one_more_layer)
    with pytest.raises(ArtifactError, match=r"lacks the input 'past_key\.2'"):
        Pipeline.load(folder)


def test_a_draft_from_another_export_is_refused(llama_pair: TinyPair, tmp_path: Path) -> None:
    folder = broken_copy(llama_pair, tmp_path)
    # a graph with the right I/O but from another export: re-export the same model elsewhere
    from specx.exporter import ExportOptions, export_pair

    elsewhere = tmp_path / "elsewhere"
    export_pair(
        str(llama_pair.sources["other"]),
        [],
        elsewhere,
        ExportOptions(max_length=128),
        log=lambda _m: None,
    )
    shutil.copy(elsewhere / "target.onnx", folder / "other.onnx")
    pipe = Pipeline.load(folder)
    with pytest.raises(ArtifactError, match="graphs from different exports are mixed"):
        pipe.generate("The cat", max_new_tokens=4, k=2, drafter="other")


# -- run options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 99}, r"K must be in 0\.\.16"),
        ({"k": "many"}, "K must be a number or 'auto'"),
        ({"max_new_tokens": 0}, "max-new-tokens must be >= 1"),
        ({"drafter": "nope", "k": 2}, "unknown drafter 'nope'"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top-p must be in \(0, 1\]"),
        ({"top_k": -2}, "top-k must be >= 0"),
        ({"draft_p_min": 1.5}, r"draft-p-min must be in \[0, 1\)"),
    ],
)
def test_out_of_range_options_are_refused_with_the_valid_range(
    llama_pair: TinyPair, options: dict[str, Any], message: str
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    with pytest.raises(InputError, match=message):
        pipe.generate("The cat", **options)


def test_an_empty_prompt_is_refused(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    with pytest.raises(InputError, match="the prompt is empty"):
        pipe.generate("   ")


# -- interrupts -----------------------------------------------------------------------------


# -- long runs, reuse, threads --------------------------------------------------------------


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_a_generation_to_the_cache_limit_stays_exact_with_flat_memory(
    long_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(long_pair.artifact)
    prompt = np.array([5, 9, 14, 30, 41], dtype=np.int64)
    pipe.generate(prompt, max_new_tokens=64, k=4, drafter="mixed")  # allocate the workspace
    generation = pipe.stream(prompt, max_new_tokens=5000, k=4, drafter="mixed")
    samples = []
    for _ in generation:
        samples.append((len(generation.result.token_ids), resident_bytes()))
    result = generation.result
    assert result.stats.stop_reason == "max_length"
    assert len(prompt) + len(result.token_ids) == 2048 + 1
    # memory: no growth per step once the first few hundred tokens are out
    early = next(rss for n, rss in samples if n >= 200)
    assert samples[-1][1] - early < 8 * 2**20, (early, samples[-1][1])
    eos = pipe.manifest.special_tokens.eos_token_ids
    want = hf_greedy(long_pair.target, prompt, len(result.token_ids), eos)
    assert_same_or_near_tie(long_pair.target, prompt, result.token_ids, want)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_many_generations_reuse_one_pipeline_without_leaks_and_repeat_exactly(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = "The cat is sitting"
    first = [
        pipe.generate(
            prompt, max_new_tokens=40, k=3, drafter="mixed", temperature=0.9, seed=s
        ).token_ids
        for s in range(5)
    ]
    before = resident_bytes()
    for _ in range(8):
        again = [
            pipe.generate(
                prompt, max_new_tokens=40, k=3, drafter="mixed", temperature=0.9, seed=s
            ).token_ids
            for s in range(5)
        ]
        assert again == first
    assert resident_bytes() - before < 8 * 2**20
    assert pipe.idle_workspaces("mixed") == 1  # one workspace, reused


def test_one_pipeline_serves_concurrent_threads_with_sequential_results(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompts = [np.array([10 + i, 20 + i, 30 + i], dtype=np.int64) for i in range(6)]
    want = [pipe.generate(p, max_new_tokens=50, k=3, drafter="mixed").token_ids for p in prompts]
    barrier = threading.Barrier(3)

    def job(i: int) -> list[int]:
        if i < 3:
            barrier.wait()  # make the first three really start together
        return pipe.generate(prompts[i], max_new_tokens=50, k=3, drafter="mixed").token_ids

    with ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(job, range(6)))
    assert got == want
    assert pipe.idle_workspaces("mixed") >= 2  # concurrent generations had separate workspaces


def test_gpu_providers_are_refused_when_both_onnxruntime_packages_are_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata as md

    from specx.runtime.backends import resolve_providers
    from specx.runtime.errors import ProviderError

    monkeypatch.setattr(md, "version", lambda name: "1.32.0")  # both "installed"
    with pytest.raises(ProviderError, match="both onnxruntime and onnxruntime-gpu"):
        resolve_providers(["cuda"])
    assert resolve_providers(["cpu"]) == ["CPUExecutionProvider"]

"""libspecx (native/libspecx), the runtime as a C library: through ctypes, its greedy output is
the Python runtime's, token for token and pass for pass, on tiny models of every family (gqa and
plain graphs, padding rows) and each drafter and K; its C++ tests (bad input, the wrapper,
threads, cancellation) run in the release build and under AddressSanitizer and
UndefinedBehaviorSanitizer; the example worker answers; a CMake project finds the package.
The real models' runs are in test_libspecx_real.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from libspecx_tools import K_AUTO, Library, SpecxError, binary, library_path

from conftest import needs_exporter
from specx.runtime import Pipeline

pytestmark = needs_exporter
FAMILIES = ["qwen3", "gemma3", "phi3", "smollm3", "granite", "olmo2"]
INVALID_ARGUMENT, ARTIFACT, PROVIDER, UNSUPPORTED = 1, 2, 3, 4
SANITIZED = library_path().parent.parent / "build-sanitize"


@pytest.fixture(scope="session")
def lib() -> Library:
    if not library_path().is_file():
        if os.environ.get("SPECX_REQUIRE_KERNELS"):
            pytest.fail(f"libspecx is not built ({library_path()}): scripts/build_libspecx.sh")
        pytest.skip("libspecx is not built (scripts/build_libspecx.sh)")
    return Library()


@pytest.fixture(scope="session")
def families(tmp_path_factory: Any, tokenizer: Any) -> dict[str, Path]:
    """Each family's tiny target with a perturbed copy as its draft `mixed` (gqa graphs)."""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("libspecx-families")
    vocab = tokenizer.get_vocab_size()
    out = {}
    for arch in FAMILIES:
        target = tiny_models.build_model(arch, vocab, seed=1)
        draft = tiny_models.perturbed_copy(target, 0.02, seed=7)
        src = tiny_models.save(target, tokenizer, root / f"{arch}-target")
        dsrc = tiny_models.save(draft, tokenizer, root / f"{arch}-draft")
        export_pair(
            str(src),
            [f"mixed={dsrc}"],
            root / arch,
            ExportOptions(max_length=96),
            log=lambda _m: None,
        )
        out[arch] = root / arch
    return out


def prompts(vocab: int, lengths: tuple[int, ...] = (1, 7, 30)) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


def assert_same_as_python(
    lib: Library, artifact: Path, new_tokens: int = 24, provider: str = "cpu"
) -> None:
    """Every drafter, K 0, 1 and 4: C ids == Python ids, and the same passes and acceptance;
    K auto (whose K follows measured times): the same ids."""
    model = lib.load(artifact, provider=provider)
    pipeline = Pipeline.load(artifact, providers=[provider])
    try:
        assert model.drafters == pipeline.drafter_names
        for prompt in prompts(model.vocab_size):
            for name in model.drafters:
                for k in [0] if name == "none" else [1, 4, K_AUTO]:
                    got = model.generate(prompt, new_tokens, k, name)
                    py_k = "auto" if k == K_AUTO else k
                    want = pipeline.generate(
                        prompt, k=py_k, drafter=name, max_new_tokens=new_tokens
                    )
                    where = f"{artifact.name}, {name}, K={py_k}, prompt of {len(prompt)}"
                    assert got.tokens == want.token_ids, where
                    if k == K_AUTO:
                        assert got.stats["adaptive"] == 1 and got.stats["k"] == 8, where
                        continue
                    stats = want.stats
                    assert got.stats["target_passes"] == stats.target_passes, where
                    assert got.stats["draft_passes"] == stats.draft_passes, where
                    assert got.stats["accepted"] == stats.accepted, where
                    assert got.stats["proposed"] == stats.proposed, where
                    assert got.stats["stop_reason"] == stats.stop_reason, where
    finally:
        model.close()


@pytest.mark.parametrize(
    "pair", ["llama_pair", "llama_plain_pair", "gpt2_pair", "qwen2_padded_pair", "mistral_pair"]
)
def test_c_greedy_ids_equal_python_ids_for_every_drafter_and_k(
    lib: Library, pair: str, request: Any
) -> None:
    assert_same_as_python(lib, request.getfixturevalue(pair).artifact)


@pytest.mark.parametrize("arch", FAMILIES)
def test_c_greedy_ids_equal_python_ids_in_every_family(
    lib: Library, families: dict[str, Path], arch: str
) -> None:
    assert_same_as_python(lib, families[arch])


def test_a_generation_stops_at_the_cache_as_python_does(lib: Library, llama_pair: Any) -> None:
    model = lib.load(llama_pair.artifact)
    pipeline = Pipeline.load(llama_pair.artifact)
    prompt = prompts(model.vocab_size, (llama_pair.max_length - 5,))[0]
    for name, k in (("none", 0), ("mixed", 4), ("ngram+mixed", 3)):
        got = model.generate(prompt, 50, k, name)
        want = pipeline.generate(prompt, k=k, drafter=name, max_new_tokens=50)
        assert got.tokens == want.token_ids
        assert got.stats["stop_reason"] == want.stats.stop_reason == "max_length"
    model.close()


def test_the_negative_control_a_perturbed_graph_gives_other_ids(
    lib: Library, llama_pair: Any, tmp_path: Path
) -> None:
    """The comparison can fail: the target's graph swapped for the draft `other`'s (another
    seed, same shapes) changes what C generates while Python still runs the original."""
    copy = tmp_path / "swapped"
    shutil.copytree(llama_pair.artifact, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    other = next(d for d in manifest["drafts"] if d["name"] == "other")
    shutil.copy(copy / other["graph"], copy / manifest["target"]["graph"])
    if (copy / (other["graph"] + ".data")).is_file():
        shutil.copy(
            copy / (other["graph"] + ".data"), copy / (manifest["target"]["graph"] + ".data")
        )
    manifest["drafts"] = []
    manifest["default_drafter"] = None
    (copy / "manifest.json").write_text(json.dumps(manifest))
    model = lib.load(copy)
    prompt = prompts(model.vocab_size)[1]
    swapped = model.generate(prompt, 24, 0, "none").tokens
    want = Pipeline.load(llama_pair.artifact).generate(prompt, k=0, max_new_tokens=24).token_ids
    assert swapped != want
    model.close()


def _broken_copy(src: Path, tmp_path: Path, edit: Any) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(src, copy)
    edit(copy)
    return copy


@pytest.mark.parametrize(
    ("edit", "code", "needle"),
    [
        (lambda d: (d / "manifest.json").unlink(), ARTIFACT, "holds no manifest.json"),
        (
            lambda d: (d / "manifest.json").write_text("{not json"),
            ARTIFACT,
            "cannot be read as JSON",
        ),
        (
            lambda d: _edit_manifest(d, format_version=99),
            ARTIFACT,
            "newer than this libspecx understands",
        ),
        (lambda d: _edit_manifest(d, pair_id=None), ARTIFACT, "'pair_id'"),
        (lambda d: _target_graph(d).unlink(), ARTIFACT, "is missing"),
        (lambda d: _target_graph(d).write_bytes(b"\x08\x07garbage"), ARTIFACT, "cannot load"),
        (lambda d: _edit_manifest(d, pair_id="another-export"), ARTIFACT, "another export"),
        (lambda d: _edit_manifest(d, max_length=100000), ARTIFACT, "exceeds"),
    ],
)
def test_a_broken_artifact_is_an_error_code_and_message_never_a_crash(
    lib: Library, llama_pair: Any, tmp_path: Path, edit: Any, code: int, needle: str
) -> None:
    broken = _broken_copy(llama_pair.artifact, tmp_path, edit)
    with pytest.raises(SpecxError) as caught:
        lib.load(broken)
    assert caught.value.code == code
    assert needle in caught.value.message


def _edit_manifest(folder: Path, **fields: Any) -> None:
    data = json.loads((folder / "manifest.json").read_text())
    for key, value in fields.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    (folder / "manifest.json").write_text(json.dumps(data))


def _target_graph(folder: Path) -> Path:
    return folder / json.loads((folder / "manifest.json").read_text())["target"]["graph"]


def test_bad_settings_are_refused_by_name(lib: Library, llama_pair: Any) -> None:
    model = lib.load(llama_pair.artifact)
    with pytest.raises(SpecxError) as caught:
        model.generate([1, 2, 3], 8, K_AUTO, "none")
    assert (
        caught.value.code == INVALID_ARGUMENT and "K auto needs a drafter" in caught.value.message
    )
    with pytest.raises(SpecxError) as caught:
        model.generate([1, 2, 3], 8, 17, "ngram")
    assert caught.value.code == INVALID_ARGUMENT
    model.close()


@pytest.mark.parametrize("provider", ["cuda", "tensorrt"], ids=["cuda-ep", "trt-ep"])
def test_a_gpu_provider_onnx_runtime_lacks_is_refused_naming_what_is_there(
    lib: Library, llama_pair: Any, provider: str
) -> None:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        pytest.skip("this ONNX Runtime has CUDA: scripts/gpu_check.sh runs libspecx on it")
    with pytest.raises(SpecxError) as caught:
        lib.load(llama_pair.artifact, provider=provider)
    message = caught.value.message
    assert caught.value.code == PROVIDER, message
    assert f"execution provider '{provider}' is not available" in message
    assert ", ".join(available) in message and "onnxruntime-gpu" in message
    with pytest.raises(SpecxError) as caught:
        lib.load(llama_pair.artifact, provider="tpu")
    assert (
        caught.value.code == INVALID_ARGUMENT and "unknown provider 'tpu'" in caught.value.message
    )


@pytest.mark.gpu
@pytest.mark.parametrize("pair", ["llama_plain_pair", "fp16_pair"])
def test_on_cuda_c_greedy_ids_equal_python_ids_on_cuda(
    lib: Library, request: pytest.FixtureRequest, pair: str
) -> None:
    artifact = request.getfixturevalue(pair).artifact
    try:
        lib.load(artifact, provider="cuda").close()
    except SpecxError as e:  # libspecx built against a CPU-only ONNX Runtime
        pytest.skip(f"libspecx cannot run CUDA here: {e.message[:200]}")
    assert_same_as_python(lib, artifact, provider="cuda")


def _run_cpp(build: Path, artifact: Path, *args: str) -> None:
    program = build / "test_libspecx"
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    done = subprocess.run(
        [str(program), str(artifact), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"PASS {args[0]}" in done.stdout


@pytest.mark.parametrize("build", ["release", "sanitized"])
@pytest.mark.parametrize(
    "what", [("errors",), ("wrapper",), ("threads", "4"), ("cancel",), ("contexts",)]
)
def test_the_cpp_tests_pass(
    lib: Library, llama_pair: Any, build: str, what: tuple[str, ...]
) -> None:
    folder = library_path().parent if build == "release" else SANITIZED
    if not (folder / "test_libspecx").is_file():
        if os.environ.get("SPECX_REQUIRE_KERNELS"):
            pytest.fail(f"{folder}/test_libspecx is not built: scripts/build_libspecx.sh --test")
        pytest.skip(f"{folder}/test_libspecx is not built")
    _run_cpp(folder, llama_pair.artifact, *what)


def test_the_example_worker_answers_with_the_python_runtimes_ids(
    lib: Library, llama_pair: Any
) -> None:
    pipeline = Pipeline.load(llama_pair.artifact)
    prompt = prompts(pipeline.manifest.target.vocab_size)[2]
    requests = [
        {
            "id": 1,
            "prompt": prompt,
            "max_new_tokens": 20,
            "k": 4,
            "drafter": "mixed",
            "stream": True,
            "text": True,
        },
        {"id": 2, "prompt": prompt, "max_new_tokens": 20, "k": 0},
        {"id": 3, "prompt": [10**9], "max_new_tokens": 5},
        "this is no JSON",
    ]
    lines = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in requests) + "\n"
    done = subprocess.run(
        [str(binary("specx_worker")), str(llama_pair.artifact), "1"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert answers[0]["ready"] is True
    want = pipeline.generate(prompt, k=0, max_new_tokens=20).token_ids
    deltas = [a["delta"] for a in answers if a.get("id") == 1 and "delta" in a]
    final = {a["id"]: a for a in answers[1:] if "delta" not in a}
    assert [t for d in deltas for t in d] == final[1]["tokens"] == want
    texts = [a["text"] for a in answers if a.get("id") == 1 and "delta" in a]
    assert "".join(texts) == final[1]["text"] == pipeline.codec.decode(want)
    assert "text" not in final[2]
    assert final[1]["stats"]["drafter"] == "mixed" and final[1]["stats"]["accepted"] > 0
    assert final[2]["tokens"] == want and final[2]["stats"]["target_passes"] == 20
    assert final[3]["error"]["code"] == INVALID_ARGUMENT
    assert "token ids must lie in" in final[3]["error"]["message"]
    assert final[None]["error"]["message"].startswith("bad request")


def test_a_cmake_project_finds_the_package_and_runs_an_artifact(
    lib: Library, llama_pair: Any, tmp_path: Path
) -> None:
    prefix = library_path().parent / "prefix"
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(consumer CXX)\n"
        "set(CMAKE_CXX_STANDARD 17)\nfind_package(specx 0.1 CONFIG REQUIRED)\n"
        "add_executable(consumer main.cc)\ntarget_link_libraries(consumer PRIVATE specx::specx)\n"
    )
    (tmp_path / "main.cc").write_text(
        '#include <cstdio>\n#include "specx.hpp"\n'
        "int main(int, char** argv) {\n"
        "  specx::Model model(argv[1]);\n"
        "  specx::Params params;\n  params.max_new_tokens(12).k(0);\n"
        "  for (int64_t id : specx::Generation(model, {1, 2, 3}, params).run())"
        ' std::printf("%lld ", (long long)id);\n'
        "  return 0;\n}\n"
    )
    build = tmp_path / "build"
    cmake = shutil.which("cmake") or "cmake"
    subprocess.run(
        [cmake, "-S", str(tmp_path), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"],
        check=True,
        capture_output=True,
    )
    subprocess.run([cmake, "--build", str(build)], check=True, capture_output=True)
    done = subprocess.run(
        [str(build / "consumer"), str(llama_pair.artifact)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    want = Pipeline.load(llama_pair.artifact).generate([1, 2, 3], k=0, max_new_tokens=12)
    assert [int(t) for t in done.stdout.split()] == want.token_ids

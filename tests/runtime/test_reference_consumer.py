"""The artifact format is a contract another engine can implement: reference/consumer.py, written
from docs/artifact-format.md alone and importing nothing from specx, reproduces specx's token ids
(and its acceptance counts) on every graph variant, drafter kind and decoding mode."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from reference import reference_consumer
from specx.runtime import Pipeline

pytestmark = needs_exporter

CONSUMER = Path(__file__).resolve().parents[2] / "reference" / "consumer.py"
ALLOWED = {
    "numpy",
    "onnxruntime",
    "tokenizers",
    "argparse",
    "json",
    "os",
    "sys",
    "pathlib",
    "typing",
    "__future__",
}


def consumer() -> ModuleType:
    return reference_consumer()


def test_the_consumer_imports_nothing_but_numpy_onnxruntime_tokenizers_and_the_stdlib() -> None:
    tree = ast.parse(CONSUMER.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            imported.add((node.module or "").split(".")[0])
    assert imported <= ALLOWED, imported - ALLOWED


def same_as_specx(pair: TinyPair, drafter: str, k: int, sampling: dict[str, Any] | None) -> None:
    pipe = Pipeline.load(pair.artifact)
    rng = np.random.default_rng(len(drafter) + k)
    for length in (1, 6):
        prompt = rng.integers(3, 300, size=length).tolist()
        # no cache scope: suffix drafting reads the context alone (no earlier generations),
        # as the consumer, which runs one generation, does
        options: dict[str, Any] = dict(max_new_tokens=40, k=k, drafter=drafter, cache_scope=None)
        if sampling:
            options.update(sampling)
        want = pipe.generate(prompt, **options)
        got = consumer().generate(pair.artifact, prompt, 40, drafter if k else "none", k, sampling)
        assert got["token_ids"] == want.token_ids, (drafter, k, length)
        assert (got["proposed"], got["accepted"]) == (want.stats.proposed, want.stats.accepted)


SAMPLING = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.0, "seed": 7}


@pytest.mark.parametrize(
    "pair_name",
    ["llama_pair", "llama_plain_pair", "gpt2_pair", "gpt2_gqa_pair", "qwen2_padded_pair"],
)
@pytest.mark.parametrize(
    ("drafter", "k"),
    [
        ("none", 0),
        ("mixed", 3),
        ("ngram", 4),
        ("ngram+mixed", 2),
        ("suffix", 5),
        ("suffix+mixed", 3),
        ("self", 5),
    ],
)
def test_the_reference_consumer_reproduces_specx_greedy(
    request: pytest.FixtureRequest, pair_name: str, drafter: str, k: int
) -> None:
    same_as_specx(request.getfixturevalue(pair_name), drafter, k, None)


@pytest.mark.parametrize("pair_name", ["llama_pair", "llama_plain_pair"])
@pytest.mark.parametrize(("drafter", "k"), [("none", 0), ("mixed", 3), ("ngram+other", 2)])
def test_the_reference_consumer_reproduces_specx_sampling(
    request: pytest.FixtureRequest, pair_name: str, drafter: str, k: int
) -> None:
    same_as_specx(request.getfixturevalue(pair_name), drafter, k, SAMPLING)


def test_the_consumer_runs_standalone_from_the_command_line(llama_pair: TinyPair) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPECX_THREAD_POOL"}
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['consumer', {str(llama_pair.artifact)!r}, '--prompt', 'The cat is', "
        "'-n', '12', '--draft', 'mixed', '-k', '3']\n"
        f"try:\n    runpy.run_path({str(CONSUMER)!r}, run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('SPECX-LOADED' if any(m.startswith('specx') for m in sys.modules) else 'CLEAN')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "CLEAN"
    got = json.loads(lines[0])
    want = Pipeline.load(llama_pair.artifact).generate(
        "The cat is", max_new_tokens=12, k=3, drafter="mixed"
    )
    assert got["token_ids"] == want.token_ids and got["text"] == want.text


@pytest.fixture(scope="module")
def specx_kernels_pair(tmp_path_factory: Any) -> Path:
    """A tiny GGUF pair exported on the specx kernels (op_libraries: specx_kernels)."""
    pytest.importorskip("gguf")
    from kernel_tools import kernels_path

    from specx.exporter import ExportOptions, export_pair
    from tests.gguf_models import write_gguf

    kernels_path()
    folder = tmp_path_factory.mktemp("specxkernels")
    target = write_gguf(folder / "t.gguf", "qwen2", seed=0)
    draft = write_gguf(folder / "d.gguf", "qwen2", seed=0, redraw=("blk.1.ffn_down.weight",))
    options = ExportOptions(max_length=128, precision="int4", kernels="specx")
    export_pair(str(target), [str(draft)], folder / "artifact", options, lambda _m: None)
    return folder / "artifact"


@pytest.mark.parametrize(("drafter", "k"), [("none", 0), ("draft", 3), ("ngram+draft", 2)])
def test_the_reference_consumer_runs_graphs_on_the_specx_kernels_and_reproduces_specx(
    specx_kernels_pair: Path, drafter: str, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernel_tools import kernels_path

    module = consumer()
    module.OP_LIBRARIES["specx_kernels"] = kernels_path()
    prompt = [5, 17, 42, 8]
    want = Pipeline.load(specx_kernels_pair).generate(
        prompt, max_new_tokens=30, k=k, drafter=drafter
    )
    got = module.generate(specx_kernels_pair, prompt, 30, drafter if k else "none", k, None)
    assert got["token_ids"] == want.token_ids
    module.OP_LIBRARIES.clear()  # negative control: without the library it says what to pass
    monkeypatch.delenv("SPECX_KERNELS_LIBRARY", raising=False)
    with pytest.raises(SystemExit, match="--op-library specx_kernels=PATH"):
        module.generate(specx_kernels_pair, prompt, 4, "none", 0, None)

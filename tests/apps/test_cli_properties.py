"""Property tests: whatever a user types or an artifact holds, specx ends with exit 0 or a clean
error (exit 2), never a traceback or "this is a bug in specx", allocates no more than the graphs
allow, and leaves the artifact as it was.

Random and extreme values go to every numeric option of `specx run`, and random values of every
JSON kind to the fields of a copy of a manifest (top level, the special tokens, the profile,
every field of every model entry).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TinyPair, needs_exporter
from specx.apps.cli.main import main

pytestmark = needs_exporter

MAX_TRACED_BYTES = 256 * 2**20  # the tiny artifacts' caches and logits take a few MB

EXTREME_FLOATS = st.sampled_from(
    [0.0, -0.0, 1e-310, 5e-324, 1e-300, 1e308, -1e308, float("inf"), float("-inf"), float("nan")]
)
FLOATS = st.one_of(EXTREME_FLOATS, st.floats(-10, 10), st.floats(allow_nan=True))
INTS = st.one_of(
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30]), st.integers(-100, 100)
)
OPTIONS = {
    "--temperature": FLOATS,
    "--top-k": INTS,
    "--top-p": FLOATS,
    "--min-p": FLOATS,
    "--draft-p-min": FLOATS,
    "--seed": INTS,
    "-k": st.one_of(INTS, st.sampled_from(["auto", "x", "", "4.5", " 3"])),
    "--max-k": INTS,
    "-n": st.one_of(st.integers(-3, 200), st.sampled_from([10**9, -(10**9)])),
    "--threads": st.one_of(st.integers(-3, 4), st.sampled_from([2**31, 10**6])),
}


def clean_exit(result: Result) -> None:
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    assert result.exit_code in (0, 2), output
    assert "Traceback" not in output and "bug in specx" not in output, output


def invoke(args: list[str]) -> Result:
    tracemalloc.start()
    try:
        result = CliRunner().invoke(main, args)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_TRACED_BYTES, (args, peak)
    return result


def fingerprint(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    chosen=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.none(), min_size=1, max_size=4),
    data=st.data(),
)
def test_any_numeric_run_option_ends_cleanly(
    llama_pair: TinyPair, chosen: dict[str, None], data: st.DataObject
) -> None:
    before = fingerprint(llama_pair.artifact)
    args = ["run", str(llama_pair.artifact), "-p", "The cat", "--draft", "mixed"]
    if "-n" not in chosen:
        args += ["-n", "8"]
    for option in chosen:
        args += [option, str(data.draw(OPTIONS[option], label=option))]
    clean_exit(invoke(args))
    assert fingerprint(llama_pair.artifact) == before


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        INTS,
        st.sampled_from([10**9, 2**31 - 1, 1.5, -0.5, 1e300, 3.0]),
        st.sampled_from(["", "x", "../manifest.json", "/etc/passwd", "none", "target.onnx"]),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def field_paths(data: dict[str, Any]) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = [(k,) for k in data]
    paths += [("special_tokens", k) for k in data["special_tokens"]]
    paths += [("profile", k) for k in ("providers", "k_default", "k_max")]
    for model in ("target", "drafts"):
        entries = [data[model]] if model == "target" else data[model]
        for i, entry in enumerate(entries):
            prefix = (model,) if model == "target" else (model, str(i))
            paths += [(*prefix, k) for k in entry]
    return paths


def put(data: Any, path: tuple[str, ...], value: Any) -> None:
    """Set the field at `path`, where an earlier draw left its parents in place (a draw may have
    replaced `drafts` by a scalar or a shorter list: then there is nothing to set)."""
    for key in path[:-1]:
        if isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        elif isinstance(data, dict):
            data = data.setdefault(key, {})
        else:
            return
    if isinstance(data, dict):
        data[path[-1]] = value


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: Any, llama_pair: TinyPair) -> Path:
    folder = tmp_path_factory.mktemp("fuzz") / "artifact"
    shutil.copytree(llama_pair.artifact, folder)
    return folder


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_manifest_field_value_ends_cleanly(
    llama_pair: TinyPair, scratch: Path, data: st.DataObject
) -> None:
    original = json.loads((llama_pair.artifact / "manifest.json").read_text())
    manifest = json.loads(json.dumps(original))
    paths = field_paths(manifest)
    for _ in range(data.draw(st.integers(1, 3), label="fields")):
        path = data.draw(st.sampled_from(paths), label="field")
        put(manifest, path, data.draw(JSON_VALUES, label="/".join(path)))
    text = json.dumps(manifest)
    (scratch / "manifest.json").write_text(text)
    before = fingerprint(scratch)
    for args in (
        ["info", str(scratch)],
        ["run", str(scratch), "-p", "The cat", "-n", "6", "-k", "2"],
        ["run", str(scratch), "-p", "The cat", "-n", "6", "--chat", "-k", "auto"],
    ):
        clean_exit(invoke(args))
    assert fingerprint(scratch) == before


def test_binary_input_on_stdin_is_a_clean_error(llama_pair: TinyPair) -> None:
    result = CliRunner().invoke(main, ["run", str(llama_pair.artifact)], input=b"\xff\xfe\x00ab")
    clean_exit(result)
    assert result.exit_code == 2 and "standard input is not valid UTF-8" in result.stderr

"""manifest.json has a published JSON Schema (runtime/artifact/manifest.schema.json): every
manifest the exporter writes passes it, a full JSON-Schema implementation (the `jsonschema`
package) agrees with
the runtime's own small validator on valid and broken manifests alike, and the runtime's errors
name the field."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TinyPair, needs_exporter
from specx.runtime.artifact.contract import Manifest
from specx.runtime.artifact.schema import check_manifest, manifest_schema
from specx.runtime.errors import ArtifactError

jsonschema = pytest.importorskip("jsonschema")

pytestmark = needs_exporter


def full_validator() -> Any:
    schema = manifest_schema()
    jsonschema.Draft202012Validator.check_schema(schema)  # the schema itself is valid
    return jsonschema.Draft202012Validator(schema)


def manifest_of(pair: TinyPair) -> dict[str, Any]:
    return dict(json.loads((pair.artifact / "manifest.json").read_text()))


@pytest.mark.parametrize(
    "pair_name", ["llama_pair", "gpt2_pair", "qwen2_padded_pair", "fp16_pair", "small_vocab_pair"]
)
def test_every_exported_manifest_passes_the_schema(
    request: pytest.FixtureRequest, pair_name: str
) -> None:
    data = manifest_of(request.getfixturevalue(pair_name))
    assert list(full_validator().iter_errors(data)) == []
    assert check_manifest(data) == ""


def test_the_schema_has_a_url_free_id() -> None:
    assert manifest_schema()["$id"] == "urn:specx:manifest:1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["target"].update(max_length=-5), "target.max_length must be >= 2, got -5"),
        (lambda d: d["drafts"][1].update(num_heads="4"), "drafts[1].num_heads must be integer"),
        (lambda d: d.update(tokenizer="../x.json"), 'tokenizer "../x.json" is not allowed here'),
        (lambda d: d["target"].update(graph="/etc/passwd"), "target.graph"),
        (lambda d: d["target"].pop("dtype"), "target lacks the field(s) dtype"),
        (lambda d: d["special_tokens"].update(eos_token_ids=[True]), "eos_token_ids[0] must be"),
        (lambda d: d["target"].update(attention="flash"), "target.attention must be one of"),
        (lambda d: d.update(profile={"providers": ["tpu"]}), "profile.providers[0] must be one"),
        (lambda d: d["target"]["inputs"][0].update(shape=[1] * 9), "more than 8 items"),
    ],
)
def test_broken_manifests_are_refused_naming_the_field(
    llama_pair: TinyPair, change: Any, message: str
) -> None:
    data = manifest_of(llama_pair)
    change(data)
    assert not full_validator().is_valid(data)
    with pytest.raises(ArtifactError, match=re.escape(message)):
        Manifest.from_json(data)


def test_what_the_schema_cannot_say_is_checked_too(llama_pair: TinyPair) -> None:
    data = manifest_of(llama_pair)
    data["max_length"] = data["target"]["max_length"] + 1
    with pytest.raises(ArtifactError, match="exceeds the 128 positions of target"):
        Manifest.from_json(data)
    data = manifest_of(llama_pair)
    data["drafts"][1]["name"] = data["drafts"][0]["name"]
    with pytest.raises(ArtifactError, match="two drafts are named"):
        Manifest.from_json(data)


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["name", "dtype", "shape"]), st.integers(0, 2), max_size=2),
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_the_runtime_validator_agrees_with_a_full_json_schema_implementation(
    llama_pair: TinyPair, data: st.DataObject
) -> None:
    manifest = manifest_of(llama_pair)
    where = data.draw(st.sampled_from(["top", "target", "draft", "special", "tensor"]))
    holder: dict[str, Any] = {
        "top": manifest,
        "target": manifest["target"],
        "draft": manifest["drafts"][0],
        "special": manifest["special_tokens"],
        "tensor": manifest["target"]["outputs"][0],
    }[where]
    key = data.draw(st.sampled_from(sorted(holder)))
    holder[key] = data.draw(VALUES)
    runtime_valid = check_manifest(manifest) == ""
    assert runtime_valid == full_validator().is_valid(manifest), (where, key, holder[key])

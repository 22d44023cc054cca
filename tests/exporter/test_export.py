"""The exporter: graph contract, manifest, parity, tokenizer, pair checks, atomic output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest
from specx.runtime.errors import ExportError

pytestmark = needs_exporter


def quiet(_message: str) -> None:
    pass


@pytest.mark.parametrize(
    ("pair_name", "attention", "past_shape"),
    [
        ("llama_pair", "gqa", ("batch", 2, "cache_len", 16)),
        ("llama_plain_pair", "plain", ("batch", "past_len", 2, 16)),
        ("gpt2_gqa_pair", "gqa", ("batch", 4, "cache_len", 16)),
    ],
)
def test_graph_inputs_and_outputs_follow_the_runtime_contract(
    request: pytest.FixtureRequest, pair_name: str, attention: str, past_shape: tuple[Any, ...]
) -> None:
    import onnx

    pair: TinyPair = request.getfixturevalue(pair_name)
    manifest = Manifest.read(pair.artifact)
    spec = manifest.target
    graph = onnx.load(str(pair.artifact / spec.graph), load_external_data=False).graph

    def shape(value: Any) -> list[Any]:
        dims = value.type.tensor_type.shape.dim
        return [d.dim_param or d.dim_value for d in dims]

    assert spec.attention == attention
    assert [i.name for i in graph.input] == [t.name for t in spec.inputs]
    assert [o.name for o in graph.output] == [t.name for t in spec.outputs]
    positions = attention == "plain" or pair.arch == "gpt2"
    assert spec.inputs == contract.graph_inputs(
        spec.num_layers,
        spec.kv_heads,
        spec.head_dim,
        "float32",
        attention,
        positions,
        keep_logits=attention == "gqa",
    )
    assert spec.outputs == contract.graph_outputs(
        spec.num_layers, spec.kv_heads, spec.head_dim, spec.vocab_size, "float32", attention
    )
    for value, t in zip(graph.input, spec.inputs, strict=True):
        assert shape(value) == list(t.shape)
    for value, t in zip(graph.output, spec.outputs, strict=True):
        assert shape(value) == list(t.shape)
    past = next(t for t in spec.inputs if t.name == "past_key.0")
    assert past.shape == past_shape
    assert spec.outputs[0].shape == ("batch", "seq", spec.vocab_size)


def test_the_format_version_is_the_oldest_that_describes_the_artifact(
    llama_pair: TinyPair, llama_plain_pair: TinyPair
) -> None:
    from dataclasses import replace

    keep = Manifest.read(llama_pair.artifact).target  # gqa: takes logits_to_keep
    plain = Manifest.read(llama_plain_pair.artifact)
    assert plain.format_version == 1 and contract.format_version_for([], plain.target) == 1
    head = contract.HeadSpec("eagle", (1,), 64, 100, "eagle")
    feature = replace(plain.target, role="draft", head=head)
    assert contract.format_version_for([feature], plain.target) == 2
    assert contract.format_version_for([feature], keep) == 4
    assert contract.format_version_for([], keep) == 4


def test_manifest_records_parity_and_what_a_runtime_needs(llama_pair: TinyPair) -> None:
    data = json.loads((llama_pair.artifact / "manifest.json").read_text())
    assert data["format_version"] == 4  # gqa graphs take the logits count (a v3 reader: no)
    assert data["target"]["attention"] == "gqa"
    assert data["target"]["cache_layout"] == list(contract.CACHE_LAYOUTS["gqa"])
    assert [d["name"] for d in data["drafts"]] == ["mixed", "other", "self"]
    for spec in [data["target"], *data["drafts"]]:
        parity = spec["parity"]
        assert parity["passed"] is True
        assert parity["max_abs_logit_diff"] <= parity["tolerance"]
        assert parity["max_abs_logit_diff"] == max(
            parity[f"{s}_max_abs_diff"] for s in ("prefill", "decode", "verify")
        )
        assert parity["k"] == 4
    assert data["special_tokens"]["eos_token_ids"] == [1]
    assert data["chat_template"]
    assert data["drafts"][2]["graph"] == "target.onnx"  # the target as its own draft is shared
    assert {"torch", "transformers", "onnx"} <= set(data["exporter"]["versions"])


def test_a_tied_head_is_stored_once(llama_pair: TinyPair) -> None:
    import onnx

    graph = onnx.load(str(llama_pair.artifact / "target.onnx")).graph
    vocab = Manifest.read(llama_pair.artifact).target.vocab_size
    big = [i for i in graph.initializer if vocab in list(i.dims)]
    assert len(big) == 1
    assert any(n.op_type == "Gemm" for n in graph.node)


def test_the_copied_tokenizer_encodes_like_the_source_tokenizer(llama_pair: TinyPair) -> None:
    from transformers import AutoTokenizer

    from specx.runtime import Pipeline

    hf = AutoTokenizer.from_pretrained(llama_pair.sources["target"])
    pipe = Pipeline.load(llama_pair.artifact)
    for text in ["The cat is sitting", "naïve café 東京 🙂", "def add(a, b):\n  return"]:
        assert pipe.codec.encode(text).tolist() == hf(text)["input_ids"]
    messages = [{"role": "user", "content": "Explain KV caches"}]
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert pipe.codec.render_chat(messages) == want


def test_a_vocab_that_differs_only_by_padding_rows_is_accepted(qwen2_padded_pair: TinyPair) -> None:
    manifest = Manifest.read(qwen2_padded_pair.artifact)
    other = manifest.find_draft("other")
    assert manifest.target.vocab_size == other.vocab_size + 16
    assert manifest.tokenizer_vocab_size == other.vocab_size


def _save_tiny(tokenizer: Any, folder: Path, arch: str = "llama", vocab: int | None = None) -> str:
    import tiny_models

    model = tiny_models.build_model(arch, vocab or tokenizer.get_vocab_size(), seed=3)
    return str(tiny_models.save(model, tokenizer, folder))


def test_tokenizers_that_disagree_are_refused_naming_the_first_difference(
    tmp_path: Path, tokenizer: Any
) -> None:
    from tokenizers import Tokenizer

    import tiny_models
    from specx.exporter import export_pair

    other_tok = Tokenizer.from_str(tokenizer.to_str())
    other_tok.add_tokens(["<extra-token>"])
    other_model = tiny_models.build_model("llama", other_tok.get_vocab_size(), seed=4)
    target = _save_tiny(tokenizer, tmp_path / "t")
    draft = str(tiny_models.save(other_model, other_tok, tmp_path / "d"))
    with pytest.raises(
        ExportError, match=r"token id \d+ is None in the target and '<extra-token>'"
    ):
        export_pair(target, [draft], tmp_path / "out", log=quiet)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.partial-*"))


def test_an_unsupported_architecture_is_refused_with_the_supported_list(tmp_path: Path) -> None:
    from transformers import OPTConfig

    from specx.exporter import export_pair

    folder = tmp_path / "opt"
    OPTConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2
    ).save_pretrained(folder)
    families = "gemma3_text, gpt2, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, smollm3"
    with pytest.raises(ExportError, match=rf"'opt' is not supported.*{families}\)"):
        export_pair(str(folder), [], tmp_path / "out", log=quiet)


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig

    from specx.exporter import export_pair

    folder = tmp_path / "bert"
    BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        architectures=["BertForMaskedLM"],
    ).save_pretrained(folder)
    with pytest.raises(ExportError, match=r"'bert' model \(BertForMaskedLM\), not a causal"):
        export_pair(str(folder), [], tmp_path / "out", log=quiet)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("missing-folder", "does not exist"),
        ("empty-folder", "holds no config.json"),
        ("file.txt", "neither a model folder nor a .gguf file"),
        ("missing.gguf", "does not exist"),
    ],
)
def test_bad_source_paths_get_a_clear_error(tmp_path: Path, source: str, message: str) -> None:
    from specx.exporter import export_pair

    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(ExportError, match=message):
        export_pair(str(tmp_path / source), [], tmp_path / "out", log=quiet)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-folder", "file.txt"]


@pytest.mark.parametrize(
    ("drafts", "message"),
    [
        (["{draft}", "ngram+draft"], r"--draft 'draft' is the name of the draft .*/d, not a"),
        (["{draft}", "missing-draft.gguf"], r"--draft: .*missing-draft.gguf does not exist"),
        (["int8", "suffix+no-such-folder"], r"--draft suffix\+no-such-folder: .* does not exist"),
        (["{draft}", "{empty}"], "holds no config.json"),
    ],
)
def test_every_draft_source_is_checked_before_the_targets_export_starts(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, drafts: list[str], message: str
) -> None:
    import specx.exporter.export as exporter
    from specx.exporter import ExportOptions, export_pair

    target = _save_tiny(tokenizer, tmp_path / "t")
    places = {"draft": _save_tiny(tokenizer, tmp_path / "d"), "empty": str(tmp_path / "empty")}
    (tmp_path / "empty").mkdir()
    drafts = [d.format(**places) if "{" in d else d for d in drafts]
    drafts = [str(tmp_path / d) if d.endswith(".gguf") else d for d in drafts]

    def no_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the export started")

    monkeypatch.setattr(exporter, "_preflight", no_work)
    monkeypatch.setattr(exporter, "_export_into", no_work)
    lines: list[str] = []
    with pytest.raises(ExportError, match=message):
        export_pair(target, drafts, tmp_path / "out", ExportOptions(max_length=64), lines.append)
    assert not (tmp_path / "out").exists() and not lines


def test_an_existing_output_is_refused_without_force_and_replaced_with_it(
    tmp_path: Path, tokenizer: Any
) -> None:
    from specx.exporter import ExportOptions, export_pair

    target = _save_tiny(tokenizer, tmp_path / "t", arch="gpt2")
    out = tmp_path / "artifact"
    first = export_pair(target, [], out, ExportOptions(max_length=64), log=quiet)
    with pytest.raises(ExportError, match=r"already exists.*--force"):
        export_pair(target, [], out, ExportOptions(max_length=64), log=quiet)
    second = export_pair(target, [], out, ExportOptions(max_length=64, force=True), log=quiet)
    assert Manifest.read(out).pair_id == second.pair_id != first.pair_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "t"]


@pytest.mark.parametrize("fault", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_a_failure_mid_export_keeps_the_previous_artifact_and_leaves_nothing_partial(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    import specx.exporter.export as exporter
    from specx.exporter import ExportOptions, export_pair

    target = _save_tiny(tokenizer, tmp_path / "t", arch="gpt2")
    out = tmp_path / "artifact"
    before = export_pair(target, [], out, ExportOptions(max_length=64), log=quiet)

    def broken_parity(*args: Any, **kwargs: Any) -> None:
        raise fault

    monkeypatch.setattr(exporter, "check_graph", broken_parity)
    with pytest.raises(type(fault)):
        export_pair(target, [], out, ExportOptions(max_length=64, force=True), log=quiet)
    assert Manifest.read(out).pair_id == before.pair_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "t"]


def test_a_parity_failure_fails_the_export(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specx.exporter.checks.parity as check
    from specx.exporter import ExportOptions, export_pair

    target = _save_tiny(tokenizer, tmp_path / "t")
    monkeypatch.setattr(check, "FP32_RELATIVE_TOLERANCE", 1e-12)
    with pytest.raises(ExportError, match="disagrees with the source model"):
        export_pair(target, [], tmp_path / "out", ExportOptions(max_length=64), log=quiet)
    assert not (tmp_path / "out").exists()


def test_graphs_serve_any_batch_size(gpt2_pair: TinyPair) -> None:
    import onnxruntime as ort

    spec = Manifest.read(gpt2_pair.artifact).target
    session = ort.InferenceSession(str(gpt2_pair.artifact / spec.graph))
    batch, seq, past = 3, 4, 5
    feed: dict[str, np.ndarray] = {
        "input_ids": np.arange(batch * seq).reshape(batch, seq) + 10,
        "position_ids": np.tile(np.arange(past, past + seq), (batch, 1)),
    }
    for i in range(spec.num_layers):
        for name in (contract.past_key(i), contract.past_value(i)):
            feed[name] = np.zeros((batch, past, spec.kv_heads, spec.head_dim), np.float32)
    logits = session.run([contract.LOGITS], feed)[0]
    assert logits.shape == (batch, seq, spec.vocab_size)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_hidden_layers", 0, "num_hidden_layers = 0; a positive integer is needed"),
        ("hidden_size", "wide", "Validation error for field 'hidden_size'"),
        ("num_key_value_heads", 3, "num_key_value_heads 3 does not divide num_attention_heads"),
    ],
)
def test_a_config_with_impossible_dimensions_is_refused_naming_the_field(
    tmp_path: Path, tokenizer: Any, field: str, value: Any, message: str
) -> None:
    import json

    from specx.exporter import ExportOptions, export_pair

    target = Path(_save_tiny(tokenizer, tmp_path / "t"))
    config = json.loads((target / "config.json").read_text())
    config[field] = value
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match=message):
        export_pair(str(target), [], tmp_path / "out", ExportOptions(max_length=64), log=quiet)
    assert not (tmp_path / "out").exists()

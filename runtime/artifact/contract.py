"""The graph contract: I/O names, dtypes, symbolic dims, cache layouts, and the manifest.

This module is the single source of truth for what an exported graph looks like. The exporter
imports it to name the graph's inputs and outputs and writes it into ``manifest.json``; the
runtime reads the manifest back and checks every graph against it. A C++ service can do the same
from ``manifest.json`` alone (the format is documented in docs/artifact-format.md).

Two attention variants share the outer signature (L = number of layers):

    inputs   input_ids        int64  [batch, seq]
             position_ids     int64  [batch, seq]      absolute positions (plain graphs; gqa
                                                       graphs only where positions are learned)
    outputs  logits           float32 [batch, seq, vocab]   one row per new position

"plain" (standard ONNX ops only: the TensorRT graph). Cache layout [batch, position, kv, dim]:
    inputs   past_key.{i}, past_value.{i}   [batch, past_len, kv_heads, head_dim]
    outputs  new_key.{i},  new_value.{i}    [batch, seq, kv_heads, head_dim]   new positions only
  The runtime binds the valid prefix of a preallocated buffer as `past` and the slots right after
  it as `new`: the cache grows in place.

"gqa" (ONNX Runtime's com.microsoft GroupQueryAttention: the CPU/CUDA graph). Cache layout
[batch, kv, position, dim], one full-capacity buffer per tensor, shared by input and output:
    inputs   seqlens_k                int32 [batch]   valid positions after this pass, minus 1
             total_sequence_length    int32 []        past_len + seq
             past_key.{i}, past_value.{i}       [batch, kv_heads, cache_len, head_dim]
    outputs  present_key.{i}, present_value.{i} [batch, kv_heads, cache_len, head_dim]
  The runtime binds `past` and `present` to the same buffer: the op writes the new positions in
  place and reads only the valid ones; rotary embeddings are applied inside the op.

"batched" (standard ONNX opset 24: TensorScatter plus MatMul/Softmax attention: the graph that
verifies several sequences in one pass, each at its own length). Cache layout as gqa:
    inputs   write_indices            int64 [batch]   each row's valid positions before this pass
             past_key.{i}, past_value.{i}       [batch, kv_heads, cache_len, head_dim]
    outputs  present_key.{i}, present_value.{i} [batch, kv_heads, cache_len, head_dim]
  Row b's `seq` new keys/values are written at positions write_indices[b] .. + seq - 1 of its row
  (TensorScatter, in place when past and present share a buffer); its queries see the positions
  <= their own position_ids (and inside a layer's sliding window). Rows with fewer real tokens
  are padded: a padded position's keys land past the row's length, where nothing reads them.

"concat" (imported with `specx import`: Hugging Face Optimum's decoder layout, also the one the
onnx-community / transformers.js folders publish). The graph returns past + new as a new tensor:
    inputs   attention_mask           int64 [batch, past_len + seq]   1: a position to attend to
             past_key_values.{i}.key, .value      [batch, kv_heads, past_len, head_dim]
    outputs  present.{i}.key, present.{i}.value   [batch, kv_heads, past_len + seq, head_dim]
  The runtime keeps two preallocated buffers per tensor and binds `past` to the one the last
  pass wrote and `present` to the other (the graph's own concatenation is the only copy). A
  rolled-back position stays in place as a hole that attention_mask masks out; position_ids
  carry the logical positions, so a hole changes nothing the graph computes; when the holes
  and positions would outgrow the buffers, the valid slots are compacted once.

"genai" (imported: ONNX Runtime GenAI's model builder, its past_present_share_buffer mode).
GroupQueryAttention inside, positions and valid lengths derived from the mask:
    inputs   attention_mask           int64 [batch, past_len + seq]   all ones
             past_key_values.{i}.key, .value      [batch, kv_heads, cache_len, head_dim]
    outputs  present.{i}.key, present.{i}.value   [batch, kv_heads, cache_len, head_dim]
  As gqa: `past` and `present` bound to the same full-capacity buffer, written in place.

In all, rolling back after a rejected draft is just a smaller length (or a mask): nothing is
copied.

Feature drafts (EAGLE-style heads, docs/artifact-format.md). A target exported for one adds
    outputs  features   float32 [batch, seq, F]   hidden states of the layers in
                                                   `feature_layers`, concatenated (F = taps x
                                                   hidden_size), from the same pass that verifies
Tap i < num_layers is the residual stream entering layer i (0: the embeddings); tap num_layers is
the final normed hidden state (Hugging Face's output_hidden_states numbering). The head's graph
(a draft with a `head` record) is one decoder layer with a plain cache:
    inputs   input_ids, position_ids          int64   [batch, seq]
             features   float32 [batch, seq, F]        the target's features (from_target)
             hidden     float32 [batch, seq, hidden]   the head's own hidden_out (otherwise)
             from_target  bool  [batch, seq, 1]        which of the two each position reads
             past_key.0, past_value.0                  plain layout
    outputs  logits     float32 [batch, seq, vocab]    over the target vocabulary; -inf outside
                                                       a reduced draft vocabulary
             hidden_out float32 [batch, seq, hidden]   fed back as `hidden` for the next token
             new_key.0, new_value.0
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from specx.runtime.artifact.schema import check_manifest
from specx.runtime.errors import ArtifactError

FORMAT_VERSION = 4  # the newest format this version of specx reads and writes
# Version 2 adds feature drafts (a draft with a `head` record runs differently from a model
# draft: a version-1 reader would get it wrong). An artifact without one stays version 1, so
# version-1 readers keep reading everything they can run.
FEATURE_DRAFTS_VERSION = 2
# Version 3 adds imported graphs ("concat" attention: the Optimum layout), which older readers
# would bind with the wrong names.
IMPORTED_VERSION = 3
# Version 4 adds the logits count (KEEP_LOGITS) to exported gqa graphs: an input an older reader
# would not feed.
KEEP_LOGITS_VERSION = 4
MANIFEST_FILE = "manifest.json"
PAIR_ID_KEY = "specx.pair_id"  # ONNX metadata key: the export every graph belongs to
MAX_LENGTH_KEY = "specx.max_length"  # ONNX metadata key: positions the graph was exported for
TOKENIZER_FILE = "tokenizer.json"

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
LOGITS = "logits"
FEATURES = "features"  # target: hidden states a feature draft reads
HIDDEN = "hidden"  # head: its own previous hidden_out
FROM_TARGET = "from_target"  # head: per position, read `features` (True) or `hidden`
HIDDEN_OUT = "hidden_out"  # head: its predicted feature for the next position
HEAD_KINDS = ("eagle", "eagle3")

# Symbolic dimension names, as written into the graphs and the manifest.
BATCH = "batch"
SEQ = "seq"
PAST = "past_len"

CACHE_LEN = "cache_len"
WRITE_INDICES = "write_indices"
ATTENTION_MASK = "attention_mask"  # "concat" graphs
# How many of the last positions' logits a pass returns (int64, [] or [1]): imported graphs may
# take it under either name, exported gqa graphs take `logits_to_keep` (KEEP_LOGITS; graphs
# exported before it do not). A reader feeds the pass's token count, so that every new
# position's logits come back, or 1 where only the last row is read (a prompt's chunks): the
# head then runs on one row instead of the chunk's (the LM head is a sixth of a prompt's work).
LOGITS_TO_KEEP = ("num_logits_to_keep", "logits_to_keep")
KEEP_LOGITS = "logits_to_keep"
# an imported graph's index inputs: int64, or int32 where its exporter made them so (the
# manifest records which; readers feed the same values in that type)
INDEX_INPUTS = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)
INDEX_DTYPES = ("int64", "int32")
TOTAL = "past_len + seq"
SEQLENS_K = "seqlens_k"
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"

ATTENTIONS = ("plain", "gqa", "batched", "concat", "genai")
# Cache layouts. plain: the position axis right after batch, so that for batch 1 the first
# `past_len` positions of a buffer are a contiguous prefix that binds as `past` without a copy.
# gqa: heads before positions, the layout GroupQueryAttention reads and writes in place.
CACHE_LAYOUTS = {
    "plain": ("batch", "position", "kv_head", "head_dim"),
    "gqa": ("batch", "kv_head", "position", "head_dim"),
    "batched": ("batch", "kv_head", "position", "head_dim"),
    "concat": ("batch", "kv_head", "position", "head_dim"),
    "genai": ("batch", "kv_head", "position", "head_dim"),
}
# Attention variants whose graphs read and write one full-capacity buffer per tensor.
FULL_BUFFER = ("gqa", "batched", "genai")
# Imported graphs: the cache tensors keep their exporter's names (past_key_values.{i}.key).
IMPORTED = ("concat", "genai")

DTYPES = ("float32", "float16")


def format_version_for(
    drafts: tuple[ModelSpec, ...] | list[ModelSpec], target: ModelSpec | None = None
) -> int:
    """The oldest format that describes an artifact with these drafts (and target)."""
    models = [*drafts, *([target] if target is not None else [])]
    if any(m.attention not in IMPORTED and KEEP_LOGITS in m.input_names for m in models):
        return KEEP_LOGITS_VERSION  # an exported graph that takes the logits count
    if any(m.attention in IMPORTED or "/" in m.graph for m in models):
        return IMPORTED_VERSION  # an imported graph (a rewritten one too: one folder deep)
    return FEATURE_DRAFTS_VERSION if any(d.head is not None for d in drafts) else 1


@dataclass(frozen=True)
class HeadSpec:
    """A feature draft (EAGLE-style head): what it reads from the target and what it scores."""

    kind: str  # "eagle" (EAGLE-1/2: fc over [embedding, feature]) or "eagle3"
    feature_layers: tuple[int, ...]  # the target taps it reads, in order (see above)
    feature_size: int  # F: len(feature_layers) x the target's hidden_size
    draft_vocab_size: int  # ids its own head scores; the logits output covers the target's
    layout: str  # the checkpoint layout it came from: "eagle", "speculators", "specx"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["feature_layers"] = list(self.feature_layers)
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> HeadSpec:
        return HeadSpec(
            kind=str(data["kind"]),
            feature_layers=tuple(int(t) for t in data["feature_layers"]),
            feature_size=int(data["feature_size"]),
            draft_vocab_size=int(data["draft_vocab_size"]),
            layout=str(data.get("layout", "")),
        )


def past_key(layer: int) -> str:
    return f"past_key.{layer}"


def past_value(layer: int) -> str:
    return f"past_value.{layer}"


def concat_past(layer: int, kind: str) -> str:  # kind: "key" or "value"
    return f"past_key_values.{layer}.{kind}"


def concat_present(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"


def new_key(layer: int) -> str:
    return f"new_key.{layer}"


def new_value(layer: int) -> str:
    return f"new_value.{layer}"


def present_key(layer: int) -> str:
    return f"present_key.{layer}"


def present_value(layer: int) -> str:
    return f"present_value.{layer}"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, element type, shape (ints or symbolic names)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> TensorSpec:
        shape = tuple(d if isinstance(d, str) else int(d) for d in data["shape"])
        return TensorSpec(str(data["name"]), str(data["dtype"]), shape)


def graph_inputs(
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    cache_dtype: str,
    attention: str = "plain",
    position_ids: bool = True,
    head: tuple[int, int] | None = None,
    keep_logits: bool = False,
) -> tuple[TensorSpec, ...]:
    """head: (feature_size, hidden_size) for a feature draft's graph, else None; keep_logits: the
    graph takes KEEP_LOGITS after its caches (exported gqa graphs)."""
    specs = [TensorSpec(INPUT_IDS, "int64", (BATCH, SEQ))]
    if attention in IMPORTED:
        specs.append(TensorSpec(ATTENTION_MASK, "int64", (BATCH, TOTAL)))
    if attention not in ("gqa", *IMPORTED) or position_ids:
        specs.append(TensorSpec(POSITION_IDS, "int64", (BATCH, SEQ)))
    if head is not None:
        specs.append(TensorSpec(FEATURES, "float32", (BATCH, SEQ, head[0])))
        specs.append(TensorSpec(HIDDEN, "float32", (BATCH, SEQ, head[1])))
        specs.append(TensorSpec(FROM_TARGET, "bool", (BATCH, SEQ, 1)))
    if attention == "gqa":
        specs.append(TensorSpec(SEQLENS_K, "int32", (BATCH,)))
        specs.append(TensorSpec(TOTAL_SEQUENCE_LENGTH, "int32", ()))
    if attention == "batched":
        specs.append(TensorSpec(WRITE_INDICES, "int64", (BATCH,)))
    if attention in IMPORTED:
        length = PAST if attention == "concat" else CACHE_LEN
        for i in range(num_layers):
            for kind in ("key", "value"):
                past: tuple[int | str, ...] = (BATCH, kv_heads, length, head_dim)
                specs.append(TensorSpec(concat_past(i, kind), cache_dtype, past))
        return tuple(specs)
    if attention in FULL_BUFFER:
        shape: tuple[int | str, ...] = (BATCH, kv_heads, CACHE_LEN, head_dim)
    else:
        shape = (BATCH, PAST, kv_heads, head_dim)
    for i in range(num_layers):
        specs.append(TensorSpec(past_key(i), cache_dtype, shape))
        specs.append(TensorSpec(past_value(i), cache_dtype, shape))
    if keep_logits:
        specs.append(TensorSpec(KEEP_LOGITS, "int64", ()))
    return tuple(specs)


def graph_outputs(
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    vocab_size: int,
    cache_dtype: str,
    attention: str = "plain",
    features: int = 0,
    head_hidden: int = 0,
    logits_dtype: str = "float32",
) -> tuple[TensorSpec, ...]:
    """features: F of a target's features output (0: none); head_hidden: a feature draft's
    hidden_out width (0: not a head); logits_dtype: float16 for an imported fp16 graph."""
    specs = [TensorSpec(LOGITS, logits_dtype, (BATCH, SEQ, vocab_size))]
    if features:
        specs.append(TensorSpec(FEATURES, "float32", (BATCH, SEQ, features)))
    if head_hidden:
        specs.append(TensorSpec(HIDDEN_OUT, "float32", (BATCH, SEQ, head_hidden)))
    for i in range(num_layers):
        if attention in IMPORTED:
            length = TOTAL if attention == "concat" else CACHE_LEN
            for kind in ("key", "value"):
                shape: tuple[int | str, ...] = (BATCH, kv_heads, length, head_dim)
                specs.append(TensorSpec(concat_present(i, kind), cache_dtype, shape))
        elif attention in FULL_BUFFER:
            shape = (BATCH, kv_heads, CACHE_LEN, head_dim)
            specs.append(TensorSpec(present_key(i), cache_dtype, shape))
            specs.append(TensorSpec(present_value(i), cache_dtype, shape))
        else:
            shape = (BATCH, SEQ, kv_heads, head_dim)
            specs.append(TensorSpec(new_key(i), cache_dtype, shape))
            specs.append(TensorSpec(new_value(i), cache_dtype, shape))
    return tuple(specs)


@dataclass(frozen=True)
class ModelSpec:
    """What the runtime needs to know about one exported model (target or draft)."""

    role: str  # "target" or "draft"
    name: str  # how users select it: "target", or a drafter name such as "draft", "self"
    graph: str  # file name of the ONNX graph, relative to the artifact folder
    architecture: str  # Hugging Face model_type, e.g. "llama", "qwen2", "gpt2"
    source: str  # where the weights came from (folder, .gguf file, hub id)
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int  # rows of the logits; may exceed the tokenizer's size (padding rows)
    max_length: int  # positions the graph may address (cache capacity)
    dtype: str  # dtype of the cache and weights: "float32" or "float16"
    num_parameters: int
    weight_bytes: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parity: dict[str, Any] = field(default_factory=dict)
    variant: str = "fp32"  # its weights: "fp32", "fp16", "int8", "int4" ("plain": old fp32)
    attention: str = "plain"  # "plain" (standard ONNX, TensorRT), "gqa" (ONNX Runtime),
    # "batched" (several sequences per pass), "concat" (imported: Optimum's layout) or "genai"
    # (imported: ONNX Runtime GenAI's builder)
    operators: tuple[str, ...] = ()  # "domain:OpType" of every node kind; () if not recorded
    feature_layers: tuple[int, ...] = ()  # a target's `features` output taps (): none)
    head: HeadSpec | None = None  # a feature draft's record (None: an ordinary graph)
    # custom-op libraries the graph needs ({"domain", "name", "version", "abi"}): the specx
    # kernels (runtime/kernels/library.py) for graphs exported with --kernels specx
    op_libraries: tuple[dict[str, Any], ...] = ()
    # the export whose id the graph carries where it is not this artifact's (a draft `specx
    # import` took from another specx artifact as it was exported); None: the manifest's pair_id
    pair_id: str | None = None

    @property
    def cache_layout(self) -> tuple[str, ...]:
        return CACHE_LAYOUTS[self.attention]

    @property
    def feature_size(self) -> int:
        """Width of a target's `features` output (0: it has none)."""
        return len(self.feature_layers) * self.hidden_size

    @property
    def input_names(self) -> set[str]:
        return {t.name for t in self.inputs}

    @property
    def uses_position_ids(self) -> bool:
        return any(t.name == POSITION_IDS for t in self.inputs)

    @property
    def logits_dtype(self) -> str:
        """float32, or float16 for an imported fp16 graph (the runtime reads them as float32)."""
        return next((t.dtype for t in self.outputs if t.name == LOGITS), "float32")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = [t.to_json() for t in self.inputs]
        data["outputs"] = [t.to_json() for t in self.outputs]
        data["cache_layout"] = list(self.cache_layout)
        data["feature_layers"] = list(self.feature_layers)
        if self.head is None:
            del data["head"]
        else:
            data["head"] = self.head.to_json()
        if not self.feature_layers:
            del data["feature_layers"]
        if self.op_libraries:
            data["op_libraries"] = [dict(lib) for lib in self.op_libraries]
        else:
            del data["op_libraries"]
        if self.pair_id is None:
            del data["pair_id"]
        return data

    @staticmethod
    def from_json(data: dict[str, Any], where: str) -> ModelSpec:
        """`data` has passed the manifest's schema (Manifest.from_json checks it)."""
        attention = str(data.get("attention", "plain"))
        layout = tuple(data.get("cache_layout", CACHE_LAYOUTS[attention]))
        if layout != CACHE_LAYOUTS[attention]:
            raise ArtifactError(
                f"{where}: cache layout {list(layout)} is not {list(CACHE_LAYOUTS[attention])}",
                "re-export the artifact with this version of specx",
            )
        return ModelSpec(
            role=str(data["role"]),
            name=str(data.get("name", data["role"])),
            graph=str(data["graph"]),
            architecture=str(data["architecture"]),
            source=str(data.get("source", "")),
            num_layers=int(data["num_layers"]),
            num_heads=int(data["num_heads"]),
            kv_heads=int(data["kv_heads"]),
            head_dim=int(data["head_dim"]),
            hidden_size=int(data["hidden_size"]),
            vocab_size=int(data["vocab_size"]),
            max_length=int(data["max_length"]),
            dtype=str(data["dtype"]),
            num_parameters=int(data.get("num_parameters", 0)),
            weight_bytes=int(data.get("weight_bytes", 0)),
            inputs=tuple(TensorSpec.from_json(t) for t in data["inputs"]),
            outputs=tuple(TensorSpec.from_json(t) for t in data["outputs"]),
            parity=dict(data.get("parity", {})),
            variant=str(data.get("variant", "fp32")),
            attention=attention,
            operators=tuple(str(op) for op in data.get("operators", ())),
            feature_layers=tuple(int(t) for t in data.get("feature_layers", ())),
            head=HeadSpec.from_json(data["head"]) if data.get("head") is not None else None,
            op_libraries=tuple(dict(lib) for lib in data.get("op_libraries", ())),
            pair_id=str(data["pair_id"]) if data.get("pair_id") is not None else None,
        )

    def expected_inputs(self) -> tuple[TensorSpec, ...]:
        # the optional logits count (LOGITS_TO_KEEP), as the export or import recorded it
        keep = tuple(t for t in self.inputs if t.name in LOGITS_TO_KEEP)
        expected = graph_inputs(
            self.num_layers,
            self.kv_heads,
            self.head_dim,
            self.dtype,
            self.attention,
            self.uses_position_ids,
            (self.head.feature_size, self.hidden_size) if self.head is not None else None,
            keep_logits=self.attention == "gqa" and KEEP_LOGITS in {t.name for t in keep},
        )
        if self.attention not in IMPORTED:
            return expected
        return (
            tuple(
                replace(t, dtype=self.index_dtype(t.name)) if t.name in INDEX_INPUTS else t
                for t in expected
            )
            + keep
        )

    def index_dtype(self, name: str) -> str:
        """The type an index input (INDEX_INPUTS) takes: int64, or int32 where an imported
        graph takes that."""
        recorded = next((t.dtype for t in self.inputs if t.name == name), "int64")
        return recorded if self.attention in IMPORTED and recorded in INDEX_DTYPES else "int64"

    def expected_outputs(self) -> tuple[TensorSpec, ...]:
        return graph_outputs(
            self.num_layers,
            self.kv_heads,
            self.head_dim,
            self.vocab_size,
            self.dtype,
            self.attention,
            self.feature_size,
            self.hidden_size if self.head is not None else 0,
            self.logits_dtype if self.attention in IMPORTED else "float32",
        )


@dataclass(frozen=True)
class SpecialTokens:
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    bos_token: str | None = None
    eos_token: str | None = None


@dataclass(frozen=True)
class Manifest:
    format_version: int
    pair_id: str  # random id shared by every graph of one export; mixing artifacts is refused
    target: ModelSpec
    drafts: tuple[ModelSpec, ...]  # zero or more draft models; the first is the default
    tokenizer: str
    tokenizer_vocab_size: int
    special_tokens: SpecialTokens
    chat_template: str | None
    max_length: int  # usable context of the pair: min over the models
    exporter: dict[str, Any] = field(default_factory=dict)  # versions, options, timings
    default_drafter: str | None = None  # a draft name, "ngram" or "none"; None: the first draft
    profile: dict[str, Any] | None = None  # the deployment profile applied at export, resolved
    engines: tuple[dict[str, Any], ...] = ()  # TensorRT engines: model, file, versions, GPU
    batched: ModelSpec | None = None  # the target as a "batched" graph (`export --batched`)

    def find_draft(self, name: str) -> ModelSpec:
        for spec in self.drafts:
            if spec.name == name:
                return spec
        names = ", ".join(d.name for d in self.drafts) or "none"
        raise ArtifactError(f"this artifact has no draft named {name!r} (it has: {names})")

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "pair_id": self.pair_id,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer,
            "tokenizer_vocab_size": self.tokenizer_vocab_size,
            "special_tokens": asdict(self.special_tokens),
            "chat_template": self.chat_template,
            "target": self.target.to_json(),
            "drafts": [d.to_json() for d in self.drafts],
            "default_drafter": self.default_drafter,
            "profile": self.profile,
            "engines": list(self.engines),
            **({"batched": self.batched.to_json()} if self.batched is not None else {}),
            "exporter": self.exporter,
        }

    def write(self, folder: Path) -> Path:
        path = folder / MANIFEST_FILE
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        return path

    @staticmethod
    def from_json(data: dict[str, Any], where: str = MANIFEST_FILE) -> Manifest:
        """Check `data` (format version, the JSON Schema, what the schema cannot say) and read
        it. Every problem is an ArtifactError naming the field."""
        version = data.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ArtifactError(f"{where}: no integer format_version", "re-export the artifact")
        if version > FORMAT_VERSION:
            raise ArtifactError(
                f"{where} has format version {version}, newer than this specx understands "
                f"({FORMAT_VERSION})",
                "upgrade specx, or re-export the artifact with this version",
            )
        problem = check_manifest(data)
        if problem:
            raise ArtifactError(f"{where}: {problem}", "re-export the artifact with `specx export`")
        manifest = Manifest._read_fields(data, version, where)
        names = [d.name for d in manifest.drafts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ArtifactError(
                f"{where}: two drafts are named {twice[0]!r}", "re-export the artifact"
            )
        for key, spec in (
            ("target", manifest.target),
            *((f"drafts[{i}]", d) for i, d in enumerate(manifest.drafts)),
            *((("batched", manifest.batched),) if manifest.batched is not None else ()),
        ):
            if spec.num_heads % spec.kv_heads:
                raise ArtifactError(
                    f"{where}: {key}.kv_heads {spec.kv_heads} does not divide num_heads "
                    f"{spec.num_heads}",
                    "re-export the artifact with `specx export`",
                )
            if manifest.max_length > spec.max_length:
                raise ArtifactError(
                    f"{where}: max_length {manifest.max_length} exceeds the {spec.max_length} "
                    f"positions of {key} ({spec.graph})",
                    "re-export the artifact with `specx export`",
                )
        for i, draft in enumerate(manifest.drafts):
            head = draft.head
            if head is not None and (
                head.feature_layers != manifest.target.feature_layers
                or head.feature_size != manifest.target.feature_size
            ):
                raise ArtifactError(
                    f"{where}: drafts[{i}] ({draft.name}) reads target features "
                    f"{list(head.feature_layers)} ({head.feature_size} wide), the target gives "
                    f"{list(manifest.target.feature_layers)} ({manifest.target.feature_size})",
                    "re-export the artifact with `specx export`",
                )
        return manifest

    @staticmethod
    def _read_fields(data: dict[str, Any], version: int, where: str) -> Manifest:
        st = data["special_tokens"]
        special = SpecialTokens(
            bos_token_id=_int_or_none(st.get("bos_token_id")),
            eos_token_ids=tuple(int(t) for t in st.get("eos_token_ids", ())),
            pad_token_id=_int_or_none(st.get("pad_token_id")),
            bos_token=st.get("bos_token"),
            eos_token=st.get("eos_token"),
        )
        return Manifest(
            format_version=version,
            pair_id=str(data["pair_id"]),
            target=ModelSpec.from_json(data["target"], f"{where} [target]"),
            drafts=tuple(
                ModelSpec.from_json(d, f"{where} [drafts][{i}]")
                for i, d in enumerate(data.get("drafts", []))
            ),
            tokenizer=str(data["tokenizer"]),
            tokenizer_vocab_size=int(data.get("tokenizer_vocab_size", 0)),
            special_tokens=special,
            chat_template=data.get("chat_template"),
            max_length=int(data["max_length"]),
            exporter=dict(data.get("exporter", {})),
            default_drafter=data.get("default_drafter"),
            profile=data.get("profile"),
            engines=tuple(dict(e) for e in data.get("engines", [])),
            batched=(
                ModelSpec.from_json(data["batched"], f"{where} [batched]")
                if data.get("batched") is not None
                else None
            ),
        )

    @staticmethod
    def read(folder: Path) -> Manifest:
        path = folder / MANIFEST_FILE
        if not folder.is_dir():
            raise ArtifactError(
                f"{folder} is not a folder",
                "pass the folder written by `specx export -o FOLDER`",
            )
        if not path.is_file():
            raise ArtifactError(
                f"{folder} holds no {MANIFEST_FILE}",
                "pass the folder written by `specx export -o FOLDER`, or re-export",
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ArtifactError(f"{path} cannot be read as JSON: {e}", "re-export") from e
        if not isinstance(data, dict):
            raise ArtifactError(f"{path} does not hold a JSON object", "re-export")
        return Manifest.from_json(data, str(path))

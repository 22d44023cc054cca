"""Which decoder layout a folder holds, read from the graph itself (ONNX Runtime's view of its
inputs and outputs), and the model facts its config.json gives.

Held (runtime/artifact/contract.py's imported attentions):
- "concat": Hugging Face Optimum 1.14+ / onnx-community (`past_key_values.{i}.key` in,
  `present.{i}.key` = past + new out, attention_mask over past + new, logits for every new
  position);
- "genai": ONNX Runtime GenAI's model builder (genai_config.json; GroupQueryAttention reading
  and writing one buffer shared by past and present, `past_present_share_buffer`).
fp16 graphs (fp16 caches and logits, the onnx-community fp16 variants) are held too. Refused with
what to do instead: graphs without a cache, with the sequence fixed at one token (Optimum 1.13
and older), returning only the last position's logits, GenAI graphs that do not share their
buffers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import TensorSpec
from specx.runtime.errors import InputError

ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
             "tensor(int32)": "int32", "tensor(bool)": "bool"}  # fmt: skip
REEXPORT = (
    "export it with Optimum >= 1.14 (`optimum-cli export onnx --task text-generation-with-past`)"
    " or from its Hugging Face / GGUF weights with `specx export`"
)


@dataclass(frozen=True)
class Source:
    """One folder's decoder: its graph, the files it reads, its model facts and I/O."""

    folder: Path
    graph: Path  # the .onnx file
    files: tuple[Path, ...]  # the graph and the external-data files beside it
    variant: str  # "fp32", or the suffix of model_<variant>.onnx
    config: dict[str, Any]
    tokenizer: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attention: str  # "concat" or "genai"
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str  # the cache's

    @property
    def architecture(self) -> str:
        return str(self.config.get("model_type", "unknown"))


def _graph_of(folder: Path, variant: str | None) -> tuple[Path, str]:
    """The .onnx file of the folder (or its onnx/ subfolder) for `variant`."""
    roots = [folder, folder / "onnx"]
    graphs = sorted(p for root in roots if root.is_dir() for p in root.glob("*.onnx"))
    if not graphs:
        raise InputError(f"{folder} holds no .onnx graph (nor does {folder / 'onnx'})", REEXPORT)
    named = {("fp32" if p.stem == "model" else p.stem.removeprefix("model_")): p for p in graphs}
    if variant is not None:
        if variant not in named:
            raise InputError(
                f"{folder} has no {variant!r} variant (it has: {', '.join(sorted(named))})",
                "pass --variant with one of those",
            )
        return named[variant], variant
    if "fp32" in named:
        return named["fp32"], "fp32"
    if len(named) == 1:
        return next(iter(named.items()))[1], next(iter(named))
    raise InputError(
        f"{folder} holds several graphs and no model.onnx: {', '.join(sorted(named))}",
        "pick one with --variant",
    )


def _data_files(graph: Path) -> tuple[Path, ...]:
    """External-data files ONNX Runtime reads beside the graph (Optimum's model.onnx_data,
    onnx-community's model.onnx_data_1, ...)."""
    return tuple(sorted(graph.parent.glob(graph.name + "_data*"))) + tuple(
        sorted(graph.parent.glob(graph.name + ".data*"))
    )


def _config(folder: Path, graph: Path) -> dict[str, Any]:
    for where in (folder / "config.json", graph.parent / "config.json"):
        if where.is_file():
            try:
                data = json.loads(where.read_text())
            except (OSError, ValueError) as e:
                raise InputError(f"cannot read {where}: {e}") from e
            if isinstance(data, dict):
                return data
    raise InputError(
        f"{folder} has no config.json", "copy the model's config.json beside its graph"
    )


def _tokenizer(folder: Path, graph: Path) -> Path:
    for where in (folder / contract.TOKENIZER_FILE, graph.parent / contract.TOKENIZER_FILE):
        if where.is_file():
            return where
    raise InputError(
        f"{folder} has no tokenizer.json",
        "copy the model's tokenizer.json (its fast tokenizer) beside its graph",
    )


def _specs(nodes: list[Any]) -> tuple[TensorSpec, ...]:
    def shape(node: Any) -> tuple[int | str, ...]:
        return tuple(d if d is not None else "?" for d in node.shape)

    return tuple(TensorSpec(n.name, ORT_TYPES.get(n.type, n.type), shape(n)) for n in nodes)


def recognise(folder: Path, variant: str | None = None) -> Source:
    """Read `folder` as a decoder to import; refuse what the runtime cannot run, saying why."""
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder", "pass the folder the graph was exported to")
    genai = _genai_config(folder)
    if genai is not None:
        graph, picked = folder / str(genai["decoder"].get("filename", "model.onnx")), "genai"
        if not graph.is_file():
            raise InputError(f"{folder}: genai_config.json names {graph.name}, which is missing")
        config = genai["config"]
    else:
        graph, picked = _graph_of(folder, variant)
        config = _config(folder, graph)
    try:
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise InputError(
            f"onnxruntime cannot load {graph}: {str(e).splitlines()[0][:300]}",
            "check that the graph and its external-data files are complete",
        ) from e
    inputs, outputs = _specs(session.get_inputs()), _specs(session.get_outputs())
    head_dim = int(config["head_dim"]) if genai is not None else None
    _check_task(graph, outputs)
    layers, kv_heads, head_dim, dtype = _cache_shape(graph, inputs, head_dim)
    _check_io(graph, inputs, outputs, layers)
    attention = "genai" if genai is not None else "concat"
    return Source(
        folder, graph, (graph, *_data_files(graph)), picked, config, _tokenizer(folder, graph),
        inputs, outputs, attention, layers, kv_heads, head_dim, dtype,
    )  # fmt: skip


def _genai_config(folder: Path) -> dict[str, Any] | None:
    """A GenAI builder folder's decoder record and the model facts it gives (as config.json's
    keys), or None for another folder; refused where the graph does not share past and present
    or names its tensors otherwise."""
    where = folder / "genai_config.json"
    if not where.is_file():
        return None
    try:
        data = json.loads(where.read_text())
        model, decoder = data["model"], data["model"]["decoder"]
        shared = bool(data.get("search", {}).get("past_present_share_buffer", False))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"cannot read {where}: {e}") from e
    if not shared:
        raise InputError(
            f"{folder}: its graph returns past + new without sharing one buffer "
            "(past_present_share_buffer false), which its GroupQueryAttention cannot roll back",
            "build it with ONNX Runtime GenAI's builder for the CPU (it shares the buffer), or "
            + REEXPORT,
        )
    names = {**decoder.get("inputs", {}), **decoder.get("outputs", {})}
    want = {"past_key_names": "past_key_values.%d.key", "present_key_names": "present.%d.key",
            "past_value_names": "past_key_values.%d.value",
            "present_value_names": "present.%d.value"}  # fmt: skip
    for key, name in want.items():
        if names.get(key, name) != name:
            raise InputError(f"{where}: {key} is {names[key]!r}, not {name!r}", REEXPORT)
    config = {
        "model_type": model.get("type", "unknown"),
        "num_hidden_layers": decoder.get("num_hidden_layers"),
        "num_attention_heads": decoder.get("num_attention_heads"),
        "num_key_value_heads": decoder.get("num_key_value_heads"),
        "head_dim": decoder.get("head_size"),
        "hidden_size": decoder.get("hidden_size"),
        "vocab_size": model.get("vocab_size"),
        "max_position_embeddings": model.get("context_length"),
        "bos_token_id": model.get("bos_token_id"),
        "eos_token_id": model.get("eos_token_id"),
        "pad_token_id": model.get("pad_token_id"),
    }
    return {"decoder": decoder, "config": {k: v for k, v in config.items() if v is not None}}


def _check_task(graph: Path, outputs: tuple[TensorSpec, ...]) -> None:
    """A text-generation decoder returns logits: anything else was exported for another task
    (an encoder's or a feature extractor's hidden states), whatever its cache."""
    names = [t.name for t in outputs]
    if contract.LOGITS not in names:
        raise InputError(
            f"{graph.name} returns no logits (its outputs: {', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}): a graph for another task than text generation",
            REEXPORT,
        )


def _cache_shape(
    graph: Path, inputs: tuple[TensorSpec, ...], head_dim: int | None
) -> tuple[int, int, int, str]:
    """(layers, kv heads, head dim, cache dtype) from the past_key_values inputs (head_dim:
    where the graph leaves it symbolic, as GenAI's does)."""
    by_name = {t.name: t for t in inputs}
    layers = 0
    while contract.concat_past(layers, "key") in by_name:
        layers += 1
    if layers == 0:
        raise InputError(
            f"{graph.name} takes no past_key_values inputs: a graph without a KV cache "
            "cannot verify draft tokens against a cached prefix",
            REEXPORT,
        )
    first = by_name[contract.concat_past(0, "key")]
    if len(first.shape) == 4 and head_dim is not None:
        first = TensorSpec(first.name, first.dtype, (*first.shape[:3], head_dim))
    if len(first.shape) != 4 or not all(isinstance(d, int) for d in first.shape[1::2]):
        raise InputError(
            f"{graph.name}: past_key_values.0.key is {list(first.shape)}, not [batch, kv_heads, "
            "past, head_dim] with fixed heads and head size (an unsupported cache layout)",
            REEXPORT,
        )
    if first.dtype not in ("float32", "float16"):
        raise InputError(f"{graph.name}: a {first.dtype} cache is not supported", REEXPORT)
    kv_heads, head_dim = int(first.shape[1]), int(first.shape[3])
    return layers, kv_heads, head_dim, first.dtype


def _check_io(
    graph: Path, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], layers: int
) -> None:
    """The concat contract's names and ranks; a sequence axis that takes several tokens; every
    position's logits."""
    got_in, got_out = {t.name: t for t in inputs}, {t.name: t for t in outputs}
    ids = got_in.get(contract.INPUT_IDS)
    if ids is None or ids.dtype not in contract.INDEX_DTYPES or len(ids.shape) != 2:
        raise InputError(f"{graph.name} has no int64 or int32 input_ids [batch, seq]", REEXPORT)
    if ids.shape[1] == 1:
        raise InputError(
            f"{graph.name} takes one token a pass (input_ids [batch, 1]: Optimum 1.13 and "
            "older's decoder_with_past): it cannot verify K + 1 tokens in one pass",
            REEXPORT,
        )
    mask = got_in.get(contract.ATTENTION_MASK)
    if mask is None or mask.dtype not in contract.INDEX_DTYPES:
        raise InputError(f"{graph.name} has no int64 or int32 attention_mask input", REEXPORT)
    positions = got_in.get(contract.POSITION_IDS)
    if positions is not None and positions.dtype not in contract.INDEX_DTYPES:
        raise InputError(f"{graph.name}: position_ids are {positions.dtype}", REEXPORT)
    logits = got_out[contract.LOGITS]  # _check_task found it
    if len(logits.shape) != 3 or logits.shape[1] == 1:
        raise InputError(
            f"{graph.name} returns only the last position's logits: verifying K draft "
            "tokens needs every position's",
            REEXPORT,
        )
    if logits.dtype not in ("float32", "float16"):
        raise InputError(
            f"{graph.name} returns {logits.dtype} logits: specx reads float32 or float16 logits",
            "import the folder's fp32, fp16 or q4 variant (--variant)",
        )
    expected = set(contract.graph_inputs(layers, 1, 1, "float32", "concat", False))
    known = {t.name for t in expected} | {contract.POSITION_IDS, *contract.LOGITS_TO_KEEP}
    for name in contract.LOGITS_TO_KEEP:
        keep = got_in.get(name)
        if keep is not None and (keep.dtype != "int64" or keep.shape not in ((), (1,))):
            raise InputError(
                f"{graph.name}: {name} is {keep.dtype} {list(keep.shape)}, not an int64 count",
                REEXPORT,
            )
    extra = sorted(set(got_in) - known)
    if extra:
        raise InputError(f"{graph.name} has inputs specx does not feed: {extra[:4]}", REEXPORT)
    for i in range(layers):
        for kind in ("key", "value"):
            for name, table in ((contract.concat_past(i, kind), got_in),
                                (contract.concat_present(i, kind), got_out)):  # fmt: skip
                if name not in table:
                    raise InputError(f"{graph.name} lacks {name} (layer {i} of {layers})", REEXPORT)

"""Tiny random models written as GGUF files with quantized tensors, as llama.cpp's tools write
them (the gguf package): the exporter's carried-block path is tested on files like these.

Weights are random blocks in each tensor's GGUF type (every bit pattern of codes, scales and
minimums) or, for the types gguf can quantize, random floats quantized by it. A Llama file's
q/k rows are whatever the blocks hold; the loader reverse-permutes them (transformers), which the
exporter must follow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.tiny_models import CHAT_TEMPLATE, build_tokenizer

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 2


@dataclass(frozen=True)
class Shape:
    """A model's dimensions; vocab None: the tokenizer's size, else that many embedding rows
    (the rows past the tokenizer are never produced by it, as in padded real vocabularies)."""

    hidden: int = HIDDEN
    ffn: int = FFN
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    layers: int = LAYERS
    vocab: int | None = None
    context: int = 256


# Qwen2.5-7B's dimensions (its config.json): 7.6B parameters, an untied head
QWEN25_7B = Shape(hidden=3584, ffn=18944, heads=28, kv_heads=4, layers=28, vocab=152064)
# Q4_K_M's choice of types, as llama.cpp's quantizer makes it for a Qwen2 7B
Q4_K_M_TYPES = {
    "attn_q": "Q4_K",
    "attn_k": "Q4_K",
    "attn_v": "Q6_K",
    "attn_output": "Q4_K",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q4_K",
    "ffn_down": "Q6_K",
}
# each matrix's GGUF type: every carried type appears (K-quants need rows of 256 values)
MATRIX_TYPES = {
    "attn_q": "Q4_K",
    "attn_k": "Q5_K",
    "attn_v": "Q6_K",
    "attn_output": "Q4_0",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q5_0",
    "ffn_down": "Q5_1",
}
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# byte offsets of the float16 scale fields in each block layout
F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
K_SCALE = {"Q4_K": 3e-4, "Q5_K": 1.5e-4, "Q6_K": 1e-3}
FLOAT_VALUES = 1 << 24  # larger tensors: random blocks (gguf's quantizer is slow at 7B sizes)


def random_blocks(
    kind: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 1e-2
) -> np.ndarray:
    """Random bytes in `kind`'s layout (every bit pattern of codes, scales and minimums), with
    float16 scales of about `scale`; [rows, bytes per row] as GGUFReader hands them out."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for offset in F16_FIELDS[kind]:
        d = (scale * rng.uniform(0.5, 1.5, size=n)).astype(np.float16)
        raw[:, offset : offset + 2] = d.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


def _quantized(
    kind: str, rows: int, cols: int, rng: np.random.Generator, gain: float = 1.0
) -> np.ndarray:
    """[rows, bytes per row] uint8 of a random tensor in `kind`: random floats quantized by gguf
    where it can, else random blocks scaled to weights of a similar size (times `gain`)."""
    import gguf

    if kind in QUANTIZABLE and rows * cols <= FLOAT_VALUES:
        w = rng.normal(0, 0.3 * gain, size=(rows, cols)).astype(np.float32)
        return np.asarray(gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind]))
    return random_blocks(kind, rows, cols, rng, K_SCALE.get(kind, 2e-3) * gain)


def _tokenizer_fields(tok: Any) -> tuple[list[str], list[str]]:
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    # transformers' GGUF tokenizer converter adds this token where the file lacks it
    return [t for t, _ in vocab] + ["<|endoftext|>"], merges


def write_gguf(
    path: Path,
    arch: str = "qwen2",
    seed: int = 0,
    types: dict[str, str] | None = None,
    head: str | None = "Q8_0",
    embedding: str = "Q4_K",
    redraw: tuple[str, ...] = (),
    shape: Shape = Shape(),
) -> Path:
    """A tiny `arch` ("qwen2" or "llama") model as a GGUF file. head None: no output.weight
    (the loader ties the head to the embedding). redraw: tensors drawn from another stream,
    the rest as for the same seed (a draft that often agrees with the seed's model). shape:
    other dimensions (weights scaled by 1/sqrt(hidden / 256), so that deep wide random models
    keep finite, varied logits)."""
    import gguf

    types = types or MATRIX_TYPES
    rng = np.random.default_rng(seed)
    other = np.random.default_rng(seed + 1000)
    tokens, merges = _tokenizer_fields(build_tokenizer(320))
    vocab = shape.vocab or len(tokens)
    gain = float(np.sqrt(HIDDEN / shape.hidden))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    if shape.vocab:
        w.add_vocab_size(shape.vocab)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)

    def matrix(name: str, kind: str, rows: int, cols: int) -> None:
        qtype = gguf.GGMLQuantizationType[kind]
        data = _quantized(kind, rows, cols, rng, gain)
        if name in redraw:
            data = _quantized(kind, rows, cols, other, gain)
        w.add_tensor(name, data, raw_dtype=qtype)

    def vector(name: str, n: int, mean: float = 1.0) -> None:
        w.add_tensor(name, (mean + rng.normal(0, 0.1, size=n)).astype(np.float32))

    hidden, ffn, kv_rows = shape.hidden, shape.ffn, shape.kv_heads * shape.hidden // shape.heads
    shapes = {
        "attn_q": (hidden, hidden),
        "attn_k": (kv_rows, hidden),
        "attn_v": (kv_rows, hidden),
        "attn_output": (hidden, hidden),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }
    matrix("token_embd.weight", embedding, vocab, hidden)
    for i in range(shape.layers):
        vector(f"blk.{i}.attn_norm.weight", hidden)
        vector(f"blk.{i}.ffn_norm.weight", hidden)
        for part, (rows, cols) in shapes.items():
            matrix(f"blk.{i}.{part}.weight", types[part], rows, cols)
            if arch == "qwen2" and part in ("attn_q", "attn_k", "attn_v"):
                vector(f"blk.{i}.{part}.bias", rows, mean=0.0)
    vector("output_norm.weight", hidden)
    if head is not None:
        matrix("output.weight", head, vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

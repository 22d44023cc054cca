"""Binding a pass's cache tensors and outputs to ONNX Runtime's I/O binding, per attention
variant (runtime/artifact/contract.py): the protocol of docs/artifact-format.md, "Caches and the
zero-copy protocol"."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import numpy as np

from specx.runtime.artifact import contract
from specx.runtime.concat_cache import ConcatCache
from specx.runtime.kv_cache import KVCache


def bind_cache(
    io: Any,
    cache: KVCache,
    past: int,
    seq: int,
    inputs: Container[str] | None = None,
    outputs: Container[str] | None = None,
) -> None:
    """Bind each layer's cache tensors for a pass of `seq` tokens after `past` valid ones:
    plain layout, past = the valid prefix of each buffer and new = the slots right after it;
    full-buffer layouts, past and present = the same whole buffer. `inputs` / `outputs`: bind
    only these names (a graph holding part of the layers: exporter/checks/parts.py)."""
    full = cache.layout in contract.FULL_BUFFER
    dev, dev_id, dt = cache.device, cache.device_id, cache.np_dtype
    past_shape = list(cache.shape) if full else [1, past, cache.kv_heads, cache.head_dim]
    new_shape = list(cache.shape) if full else [1, seq, cache.kv_heads, cache.head_dim]
    for layer in range(cache.num_layers):
        for name_in, name_out, ptr in (
            (*_cache_names(cache.layout, layer, "key"), cache.key_ptr),
            (*_cache_names(cache.layout, layer, "value"), cache.value_ptr),
        ):
            if inputs is None or name_in in inputs:
                io.bind_input(name_in, dev, dev_id, dt, past_shape, ptr(layer))
            if outputs is None or name_out in outputs:
                io.bind_output(
                    name_out, dev, dev_id, dt, new_shape, ptr(layer, 0 if full else past)
                )


def _cache_names(layout: str, layer: int, kind: str) -> tuple[str, str]:
    """(past input, output) names of one cache tensor in a graph of this attention variant."""
    if layout in contract.IMPORTED:
        return contract.concat_past(layer, kind), contract.concat_present(layer, kind)
    if kind == "key":
        out = contract.present_key if layout in contract.FULL_BUFFER else contract.new_key
        return contract.past_key(layer), out(layer)
    out = contract.present_value if layout in contract.FULL_BUFFER else contract.new_value
    return contract.past_value(layer), out(layer)


def bind_host_output(io: Any, name: str, array: np.ndarray) -> None:
    """Bind output `name` to a C-contiguous host array of the output's shape and dtype (float32;
    float16 logits of an imported fp16 graph): the pass writes into it, no copy."""
    io.bind_output(name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data)


def bind_concat(io: Any, cache: ConcatCache, seq: int) -> None:
    """An imported graph's pass (contract "concat"): past from the buffer set the last pass
    wrote, present into the other; rolled-back slots masked out (the cache keeps its mask in
    the graph's type)."""
    past, present, slots, mask = cache.begin_pass(seq)
    io.bind_cpu_input(contract.ATTENTION_MASK, mask[None])  # [1, slots + seq]
    dt, heads, dim = cache.np_dtype, cache.kv_heads, cache.head_dim
    for layer in range(cache.num_layers):
        for j, kind in enumerate(("key", "value")):
            io.bind_input(
                contract.concat_past(layer, kind), "cpu", 0, dt, [1, heads, slots, dim],
                past[2 * layer + j],
            )  # fmt: skip
            io.bind_output(
                contract.concat_present(layer, kind), "cpu", 0, dt,
                [1, heads, slots + seq, dim], present[2 * layer + j],
            )  # fmt: skip

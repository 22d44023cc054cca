"""A feature head (heads/feature_head.py) -> its ONNX graph, checked against the torch module
through the runtime, the way the EAGLE drafter drives it: a catch-up pass over target features, then
one-token passes that read the head's own hidden_out."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from specx.exporter.checks.parity import FP32_RELATIVE_TOLERANCE
from specx.exporter.graph.trace import (
    graph_operators,
    save_graph,
    stamp_io_shapes,
    trace_graph,
    weight_stats,
)
from specx.exporter.heads.feature_head import FeatureHead
from specx.exporter.weights.load import Log
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import HeadSpec, ModelSpec
from specx.runtime.backends import OrtSession
from specx.runtime.errors import ExportError


def head_spec(head: FeatureHead, name: str, graph: str, source: str, max_length: int) -> ModelSpec:
    cfg = head.cfg
    inputs = contract.graph_inputs(
        1, cfg.kv_heads, cfg.head_dim, "float32", "plain", True, (cfg.feature_size, cfg.hidden_size)
    )
    outputs = contract.graph_outputs(
        1, cfg.kv_heads, cfg.head_dim, head.target_vocab, "float32", "plain", 0, cfg.hidden_size
    )
    return ModelSpec(
        role="draft",
        name=name,
        graph=graph,
        architecture=f"{cfg.kind}-head",
        source=source,
        num_layers=1,
        num_heads=cfg.num_heads,
        kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        hidden_size=cfg.hidden_size,
        vocab_size=head.target_vocab,
        max_length=max_length,
        dtype="float32",
        num_parameters=0,
        weight_bytes=0,
        inputs=inputs,
        outputs=outputs,
        variant="fp32",
        attention="plain",
        head=HeadSpec(
            kind=cfg.kind,
            feature_layers=cfg.taps,
            feature_size=cfg.feature_size,
            draft_vocab_size=int(head.lm_head.weight.shape[0]),
            layout=cfg.layout,
        ),
    )


def export_head(
    head: FeatureHead,
    folder: Path,
    name: str,
    source: str,
    max_length: int,
    pair_id: str,
    opset: int,
    log: Log,
) -> ModelSpec:
    import torch

    graph = f"{name}.onnx"
    spec = head_spec(head, name, graph, source, max_length)
    cfg = head.cfg
    seq, past = 3, 2
    args = (
        torch.tensor([[1, 2, 3]], dtype=torch.long),
        torch.tensor([[2, 3, 4]], dtype=torch.long),
        torch.zeros(1, seq, cfg.feature_size),
        torch.zeros(1, seq, cfg.hidden_size),
        torch.ones(1, seq, 1, dtype=torch.bool),
        torch.zeros(1, past, cfg.kv_heads, cfg.head_dim),
        torch.zeros(1, past, cfg.kv_heads, cfg.head_dim),
    )
    t0 = time.perf_counter()
    model = trace_graph(
        head,
        args,
        folder / f".{graph}.raw",
        spec.inputs,
        spec.outputs,
        opset,
        None,
        f"tracing the {cfg.kind} head {source} failed",
        "report this with the head's config.json",
    )
    stamp_io_shapes(model, spec.inputs, spec.outputs)
    params, nbytes = weight_stats(model)
    save_graph(model, folder, graph, "draft", source, pair_id, max_length, nbytes)
    scored = int(head.lm_head.weight.shape[0])
    log(
        f"  draft {name!r}: {cfg.kind} head ({cfg.layout} layout) traced in "
        f"{time.perf_counter() - t0:.1f} s, {params / 1e6:.1f}M parameters, {nbytes / 1e6:.0f} "
        f"MB, reads target layers {list(cfg.taps)}, scores {scored} ids"
    )
    return dataclasses.replace(
        spec, num_parameters=params, weight_bytes=nbytes, operators=graph_operators(model)
    )


def check_head_parity(head: FeatureHead, folder: Path, spec: ModelSpec, log: Log) -> dict:
    """The graph against the module: a catch-up pass of 6 pairs from random features, then 3
    one-token passes on the head's own hidden_out."""
    rng = np.random.default_rng(2)
    n, steps = 6, 3
    ids = rng.integers(0, head.target_vocab, size=n + steps).astype(np.int64)
    features = rng.standard_normal((n, head.cfg.feature_size)).astype(np.float32)
    got = _graph_logits(folder, spec, ids, features)
    want = _module_logits(head, ids, features)
    worst = 0.0
    agree = total = 0
    for g, w in zip(got, want, strict=True):
        finite = np.isfinite(w)
        if not np.array_equal(finite, np.isfinite(g)):
            worst = float("inf")
            break
        worst = max(worst, float(np.max(np.abs(g[finite] - w[finite]))))
        agree += int(np.sum(np.argmax(g, -1) == np.argmax(w, -1)))
        total += g.shape[0]
    scale = float(max(1.0, max(np.max(np.abs(np.where(np.isfinite(w), w, 0))) for w in want)))
    tolerance = FP32_RELATIVE_TOLERANCE * scale
    log(
        f"  draft {spec.name!r}: parity catch-up({n})/chained({steps}) max|dlogit| = {worst:.2e} "
        f"(tolerance {tolerance:.1e}), argmax agreement {agree}/{total}"
    )
    if not worst <= tolerance:
        raise ExportError(
            f"the exported {head.cfg.kind} head disagrees with its checkpoint: max |logit "
            f"difference| {worst:.3g} > tolerance {tolerance:.3g}",
            "this is a bug in the exporter for this head; please report it",
        )
    return {
        "max_abs_logit_diff": worst,
        "tolerance": tolerance,
        "argmax_agreement": agree / max(1, total),
        "passed": True,
    }


def _graph_logits(
    folder: Path, spec: ModelSpec, ids: np.ndarray, features: np.ndarray
) -> list[np.ndarray]:
    """The graph's logits through the runtime: a catch-up pass over the pairs of `features`,
    then one pass per remaining id on its own hidden_out."""
    n = len(features)
    session = OrtSession(folder / spec.graph, spec, ["cpu"], max_chunk=n)
    cache = session.new_cache(len(ids))
    logits, hidden_out = session.forward_head(ids[:n], features, None, cache)
    got = [logits.copy()]
    hidden = hidden_out[-1:].copy()
    for i in range(n, len(ids)):
        logits, hidden_out = session.forward_head(ids[i : i + 1], None, hidden, cache)
        got.append(logits.copy())
        hidden = hidden_out.copy()
    return got


def _module_logits(head: FeatureHead, ids: np.ndarray, features: np.ndarray) -> list[np.ndarray]:
    """The same passes through the torch module, its cache kept as concatenated keys/values."""
    import torch

    cfg, n = head.cfg, len(features)
    with torch.no_grad():
        empty = torch.zeros(1, 0, cfg.kv_heads, cfg.head_dim)
        logits, hidden, key, value = head(
            torch.from_numpy(ids[None, :n]),
            torch.arange(n)[None],
            torch.from_numpy(features[None]),
            torch.zeros(1, n, cfg.hidden_size),
            torch.ones(1, n, 1, dtype=torch.bool),
            empty,
            empty,
        )
        want = [logits[0].numpy()]
        last = hidden[0, -1:]
        for i in range(n, len(ids)):
            logits, hidden, k, v = head(
                torch.from_numpy(ids[None, i : i + 1]),
                torch.tensor([[i]]),
                torch.zeros(1, 1, cfg.feature_size),
                last[None],
                torch.zeros(1, 1, 1, dtype=torch.bool),
                key,
                value,
            )
            key, value = torch.cat([key, k], 1), torch.cat([value, v], 1)
            want.append(logits[0].numpy())
            last = hidden[0]
    return want

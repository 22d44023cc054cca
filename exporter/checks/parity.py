"""Parity of an exported graph against the source model, run through the runtime itself.

The graph runs in ONNX Runtime on the CPU exactly as ``specx run`` drives it (I/O binding into a
preallocated cache): a prefill of P tokens, a one-token decode step, then a verify step of
K + 1 tokens on top of that cache. The source model scores the same tokens in one plain forward
pass. The largest |logit difference| of each stage goes into the manifest; above the tolerance
the export fails. A graph larger than the part size runs the same passes in layer-range parts
(checks/parts.py), one part in memory at a time, with the same results to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.checks.parts import Output, Pass, graph_weight_bytes, run_in_parts
from specx.exporter.weights.load import Log, SourceModel
from specx.exporter.weights.nbits import QUANTIZED
from specx.exporter.weights.sources import release_heap
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.backends import OrtSession
from specx.runtime.errors import ExportError
from specx.runtime.kv_cache import KVCache

# fp32 graph vs fp32 torch: differences come from summation order only. Relative to the largest
# logit, so that it fits models whose logits are O(1) (random tests) and O(30) (trained models).
FP32_RELATIVE_TOLERANCE = 1e-4
# fp16 graph vs the fp32 source model: weight and activation rounding (11-bit mantissa) add up
# over the layers (what the tiny models show: docs/bench/measurements.md).
FP16_RELATIVE_TOLERANCE = 1e-2
PREFILL_TOKENS = 12
# A graph with more weights than this is checked in layer-range parts of at most this much,
# one in ONNX Runtime at a time (checks/parts.py; `specx export --check-part-size`).
CHECK_PART_BYTES = 1 << 30


def relative_tolerance(spec: ModelSpec) -> float:
    return FP16_RELATIVE_TOLERANCE if spec.dtype == "float16" else FP32_RELATIVE_TOLERANCE


@dataclass(frozen=True)
class Reference:
    """The source model's scores for one token sequence."""

    tokens: np.ndarray  # [T]
    logits: np.ndarray  # [T, V]
    features: np.ndarray | None  # [T, F]: the hidden states a feature draft reads, if any


def references(
    src: SourceModel, sequences: list[np.ndarray], taps: tuple[int, ...] = ()
) -> list[Reference]:
    """The source model's logits for several sequences from one forward pass over them, each
    right-padded to the longest: a causal model's scores at a position depend only on the tokens
    up to it, so what follows a sequence leaves its scores alone, and a streamed source reads
    (and dequantizes) its weights once for all of them."""
    import torch

    longest = max(len(s) for s in sequences)
    batch = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = seq
    with torch.no_grad():
        out = src.model(torch.from_numpy(batch), output_hidden_states=bool(taps))
    result = []
    for row, seq in enumerate(sequences):
        n = len(seq)
        features = (
            torch.cat([out.hidden_states[t][row, :n] for t in taps], -1).float().numpy()
            if taps
            else None
        )  # Hugging Face numbering of the layers: runtime/artifact/contract.py
        logits = out.logits[row, :n].float().numpy().copy()  # not a view of the padded batch
        result.append(Reference(seq, logits, features))
    del out
    release_heap()
    return result


def parity_tokens(src: SourceModel, spec: ModelSpec, check_k: int) -> np.ndarray:
    """Random tokens for a prefill, a one-token decode step and a verify step of K + 1."""
    k = max(1, check_k)
    prefill = max(1, min(PREFILL_TOKENS, spec.max_length - k - 2))
    total = prefill + 1 + k + 1
    if total > spec.max_length:
        raise ExportError(
            f"--max-length {spec.max_length} is too small to check K={k}",
            "use a larger --max-length",
        )
    token_range = min(len(src.tokenizer), spec.vocab_size)
    return np.random.default_rng(0).integers(0, token_range, size=total).astype(np.int64)


def parity_passes(ids: np.ndarray, k: int) -> list[Pass]:
    """A prefill, a one-token decode step and a verify step of K + 1 over parity_tokens."""
    prefill = len(ids) - k - 2
    return [
        Pass(0, 0, ids[:prefill]),
        Pass(0, prefill, ids[prefill : prefill + 1]),
        Pass(0, prefill + 1, ids[prefill + 1 :]),
    ]


def text_passes(tokens: np.ndarray, k: int) -> list[Pass]:
    """A text read one token a pass (stream 1), then K + 1 tokens a pass (stream 2)."""
    return [
        Pass(1 + w, i, tokens[i : i + width])
        for w, width in enumerate((1, k + 1))
        for i in range(0, len(tokens), width)
    ]


def run_passes(
    folder: Path, spec: ModelSpec, passes: list[Pass], part_bytes: int
) -> tuple[list[Output], int]:
    """The graph's outputs for `passes`, each stream in a cache of its own: through the
    runtime's own session when the graph's weights fit in `part_bytes`, else in layer-range
    parts, one in memory at a time (checks/parts.py: the same bits). Returns the outputs and the
    number of parts."""
    graph = folder / spec.graph
    if graph_weight_bytes(graph) > part_bytes:
        return run_in_parts(graph, spec, passes, part_bytes)
    session = OrtSession(graph, spec, ["cpu"], max_chunk=max(len(p.tokens) for p in passes))
    caches: dict[int, KVCache] = {}
    outputs = []
    for step in passes:
        if step.stream not in caches:
            ends = [p.start + len(p.tokens) for p in passes if p.stream == step.stream]
            caches[step.stream] = session.new_cache(max(ends))
        logits = session.forward(step.tokens, caches[step.stream]).copy()  # [seq, vocab]
        features = session.last_features
        outputs.append(Output(logits, None if features is None else features.copy()))
    return outputs, 1


def check_graph(
    src: SourceModel,
    folder: Path,
    spec: ModelSpec,
    check_k: int,
    log: Log,
    calibration: np.ndarray | None = None,
    part_bytes: int = CHECK_PART_BYTES,
) -> dict[str, Any]:
    """The graph's prefill, decode and verify (K + 1) passes against the source model's scores of
    the same random tokens (parity_figures), and for a quantized graph the calibration text's
    passes (quality_figures): one reference pass of the source model, one run of the graph."""
    k = max(1, check_k)
    sequences = [parity_tokens(src, spec, k)]
    if calibration is not None:
        sequences.append(calibration[: spec.max_length])
    refs = references(src, sequences, spec.feature_layers)
    passes = parity_passes(sequences[0], k)
    if calibration is not None:
        passes += text_passes(sequences[1], k)
    outputs, parts = run_passes(folder, spec, passes, part_bytes)
    if parts > 1:
        log(f"  {spec.role}: checked in {parts} parts of at most {part_bytes >> 20} MB of weights")
    result = parity_figures(spec, k, log, refs[0], outputs[:3])
    result["check_parts"] = parts
    if calibration is not None:
        result["calibration"] = quality_figures(spec, refs[1], k, log, outputs[3:])
    return result


def parity_figures(
    spec: ModelSpec, k: int, log: Log, ref: Reference, outputs: list[Output]
) -> dict[str, Any]:
    """The prefill, decode and verify passes' logits (and features) against the reference."""
    taps = spec.feature_layers
    ids, reference, ref_features = ref.tokens, ref.logits, ref.features
    total = len(ids)
    bounds = parity_passes(ids, k)
    result: dict[str, Any] = {"tokens": total, "k": k}
    worst = 0.0
    agree = 0
    feature_diff = 0.0
    for stage, step, out in zip(("prefill", "decode", "verify"), bounds, outputs, strict=True):
        start, end = step.start, step.start + len(step.tokens)
        got, want = out.logits, reference[start:end]  # [end - start, vocab]
        diff = float(np.max(np.abs(got - want)))
        result[f"{stage}_max_abs_diff"] = diff
        worst = max(worst, diff)
        agree += int(np.sum(np.argmax(got, -1) == np.argmax(want, -1)))
        if ref_features is not None and out.features is not None:
            gap = np.abs(out.features - ref_features[start:end]) / (
                1.0 + np.abs(ref_features[start:end])
            )
            feature_diff = max(feature_diff, float(np.max(gap)))
    if ref_features is not None:
        result["max_feature_diff"] = feature_diff  # relative to 1 + |feature|
        if feature_diff > 10 * relative_tolerance(spec):
            raise ExportError(
                f"the exported {spec.role} graph's features {list(taps)} disagree with the source "
                f"model's hidden states: {feature_diff:.3g}",
                "this is a bug in the exporter for this architecture; please report it",
            )
    scale = float(max(1.0, np.max(np.abs(reference))))
    tolerance = relative_tolerance(spec) * scale
    result.update(
        max_abs_logit_diff=worst,
        max_abs_logit=scale,
        tolerance=tolerance,
        argmax_agreement=agree / total,
        passed=worst <= tolerance,
        dtype=spec.dtype,
        provider="CPUExecutionProvider",
    )
    log(
        f"  {spec.role}: parity prefill/decode/verify(K+1={k + 1}) max|dlogit| = {worst:.2e} "
        f"(tolerance {tolerance:.1e}), argmax agreement {agree}/{total}"
    )
    if spec.variant in QUANTIZED:  # judged along a text instead (quality_figures)
        result["passed"] = None
        return result
    if worst > tolerance:
        raise ExportError(
            f"the exported {spec.role} graph ({spec.dtype}) disagrees with the source model: max "
            f"|logit difference| {worst:.3g} > tolerance {tolerance:.3g}",
            "this is a bug in the exporter for this architecture; please report it",
        )
    return result


def check_batch_parity(src: SourceModel, folder: Path, spec: ModelSpec, log: Log) -> dict[str, Any]:
    """A batched graph against the source model with two sequences at different lengths in one
    pass: rows prefilled alone (9 and 5 tokens), then a joint pass where row 0 verifies 4 tokens
    and row 1 takes 2 real tokens plus 2 of padding, then a joint one-token step on top of what
    each row kept (row 1's padded slots must not leak into it)."""
    lengths = (9, 5)
    token_range = min(len(src.tokenizer), spec.vocab_size)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, token_range, size=n + 5).astype(np.int64) for n in lengths]
    reference = [r.logits for r in references(src, seqs)]
    session = OrtSession(folder / spec.graph, spec, ["cpu"], max_chunk=16)
    cache = session.new_batch_cache(2, min(spec.max_length, 32))
    worst = 0.0

    def compare(got: np.ndarray, want: np.ndarray) -> None:
        nonlocal worst
        worst = max(worst, float(np.max(np.abs(got - want))))

    for row, n in enumerate(lengths):  # prefill each row alone
        got = session.forward_rows(seqs[row][None, :n], np.array([n]), cache, first_row=row)
        compare(got[0], reference[row][:n])
    joint = np.zeros((2, 4), dtype=np.int64)
    joint[0] = seqs[0][9:13]
    joint[1, :2] = seqs[1][5:7]
    got = session.forward_rows(joint, np.array([4, 2]), cache)
    compare(got[0], reference[0][9:13])
    compare(got[1, :2], reference[1][5:7])
    cache.lengths[:] = (11, 7)  # row 0 kept 2 of its 4; row 1 both real tokens
    step = np.array([[seqs[0][11]], [seqs[1][7]]], dtype=np.int64)
    got = session.forward_rows(step, np.array([1, 1]), cache)
    compare(got[0], reference[0][11:12])
    compare(got[1], reference[1][7:8])
    scale = float(max(1.0, max(np.max(np.abs(r)) for r in reference)))
    relative = FP16_RELATIVE_TOLERANCE if spec.dtype == "float16" else FP32_RELATIVE_TOLERANCE
    tolerance = relative * scale
    log(f"  {spec.role}: batched parity (2 rows, lengths 9 and 5) max|dlogit| = {worst:.2e}")
    if spec.variant in QUANTIZED:  # rounded weights and activations: recorded, not judged
        return {"batch_max_abs_logit_diff": worst, "tolerance": None, "passed": None}
    if worst > tolerance:
        raise ExportError(
            f"the batched {spec.role} graph disagrees with the source model: max |logit "
            f"difference| {worst:.3g} > tolerance {tolerance:.3g}",
            "this is a bug in the exporter for this architecture; please report it",
        )
    return {"batch_max_abs_logit_diff": worst, "tolerance": tolerance, "passed": True}


# Below this argmax agreement with its float32 source along the calibration text a quantized
# graph is broken, not just rounded.
MIN_QUANTIZED_AGREEMENT = 0.5


def quality_figures(
    spec: ModelSpec, ref: Reference, k: int, log: Log, outputs: list[Output]
) -> dict[str, Any]:
    """An int4/int8 graph along a natural text (teacher-forced, text_passes), against its
    float32 source: argmax agreement and max |dlogit|; and against itself, one token a pass
    (decode) versus K + 1 tokens a pass (verify): how often the two pick different tokens, and
    the top-2 gap of the one-token logits where they do (near-ties, or a real disagreement)."""
    tokens, reference = ref.tokens, ref.logits
    n = len(tokens)
    one = np.concatenate([o.logits for o in outputs[:n]])  # [n, vocab]
    many = np.concatenate([o.logits for o in outputs[n:]])  # [n, vocab]
    vocab = min(reference.shape[1], one.shape[1])
    agree = float(np.mean(np.argmax(one[:, :vocab], -1) == np.argmax(reference[:, :vocab], -1)))
    parted = np.flatnonzero(np.argmax(one, -1) != np.argmax(many, -1))
    top2 = np.sort(one[parted], axis=-1)[:, -2:] if parted.size else np.zeros((0, 2))
    result: dict[str, Any] = {
        "tokens": n,
        "argmax_agreement": agree,
        "max_abs_logit_diff": float(np.max(np.abs(one - reference))),
        "passes_k": k,
        "passes_max_abs_logit_diff": float(np.max(np.abs(one - many))),
        "passes_parted": int(parted.size),
        "passes_parted_top2_gaps": [float(g) for g in (top2[:, 1] - top2[:, 0])],
    }
    log(
        f"  {spec.role}: {spec.variant} along a {n}-token text: argmax agrees with the float32 "
        f"source on {100 * agree:.0f}%, max|dlogit| {result['max_abs_logit_diff']:.2f}; one-token"
        f" vs {k + 1}-token passes: max|dlogit| {result['passes_max_abs_logit_diff']:.1e}, "
        f"{parted.size} tokens differ"
    )
    if agree < MIN_QUANTIZED_AGREEMENT:
        raise ExportError(
            f"the {spec.variant} {spec.role} graph agrees with its float32 source on only "
            f"{100 * agree:.0f}% of a text: the quantization broke it",
            "use --precision int8 or fp32 for this model",
        )
    return result

"""`export_pair`: a target and its drafts -> one artifact folder, written atomically.

Every graph is written into a hidden temporary folder beside the output, checked against its
source model, and the folder is renamed into place only at the end.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.checks.parity import check_batch_parity, check_graph
from specx.exporter.draft_recipes import DraftContext, export_draft
from specx.exporter.drafts import DraftEntry, check_sources, default_drafter, resolve_drafts
from specx.exporter.graph.trace import GraphRecipe, export_graph
from specx.exporter.heads.feature_head import HeadCheckpoint, read_head
from specx.exporter.options import (
    ExportOptions,
    resolve_attention,
    resolve_kernels,
    target_precision,
    validate,
    wide_blocks,
)
from specx.exporter.planning.preflight import estimate, preflight
from specx.exporter.planning.profile import plan_pair
from specx.exporter.staging import StagedFolder
from specx.exporter.tensorrt.engines import build_engines
from specx.exporter.weights.gguf import parsed_once
from specx.exporter.weights.load import (
    Log,
    SourceModel,
    chat_template,
    open_source,
    special_tokens,
)
from specx.exporter.weights.nbits import QUANTIZED
from specx.exporter.weights.quantize import CALIBRATION_TEXT
from specx.profiles import Profile, load_profile
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.backends.trt_session import import_tensorrt
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError

__all__ = ["BATCHED_GRAPH", "ExportOptions", "export_pair"]

BATCHED_GRAPH = "target.batched.onnx"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("specx", "torch", "transformers", "onnx", "onnxruntime", "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def export_pair(
    target: str,
    drafts: Sequence[str],
    output: str | Path,
    options: ExportOptions | None = None,
    log: Callable[[str], None] = print,
) -> Manifest:
    """Export `target` and any `drafts` into the artifact folder `output`.

    Everything is written into a hidden temporary folder beside `output` and renamed into place
    only after every graph passed its parity check: a failed or interrupted export leaves no
    partial artifact, an existing artifact (with force) stays intact until the last step, and
    what a killed export left behind is removed by the next one (staging.py).
    """
    options = options or ExportOptions()
    output = Path(output)
    validate(output, options)
    profile = load_profile(options.profile) if options.profile else None
    auto_attention = options.attention == "auto"
    options = dataclasses.replace(options, attention=resolve_attention(options, profile))
    _check_engines(options, profile)
    entries = resolve_drafts(drafts, target)
    with parsed_once():  # the checks, the preflight and the export read each GGUF header once
        check_sources(target, entries)
        options = _check_drafts(target, entries, options, profile, log)
        _preflight(output, target, entries, options, profile, log)
        with StagedFolder(output, log) as staged:
            manifest = _export_into(
                staged.path, target, entries, options, profile, log, auto_attention
            )
            if options.engines and profile is not None:
                log("building TensorRT engines")
                engines = build_engines(staged.path, manifest, profile, log)
                manifest = dataclasses.replace(manifest, engines=tuple(engines))
                manifest.write(staged.path)
            staged.publish()
    return manifest


def _check_engines(options: ExportOptions, profile: Profile | None) -> None:
    """Refuse TensorRT engines for graphs TensorRT cannot parse, or without TensorRT."""
    if options.engines and options.attention != "plain":
        raise ExportError("TensorRT engines need plain graphs", "drop --attention gqa")
    quantized = {p for p in (options.precision, options.draft_precision) if p in QUANTIZED}
    if quantized and options.engines:
        raise ExportError(
            f"{'/'.join(sorted(quantized))} graphs use ONNX Runtime's MatMulNBits, which TensorRT "
            "does not parse",
            "drop --engines, or export fp16/fp32 for TensorRT",
        )
    if options.engines:
        if profile is None or not profile.tensorrt.enabled:
            raise ExportError(
                "--engines needs a profile with TensorRT enabled", "e.g. --profile gpu-datacenter"
            )
        import_tensorrt(builder=True)  # fail before any work if TensorRT is missing


def _check_drafts(
    target: str,
    entries: list[DraftEntry],
    options: ExportOptions,
    profile: Profile | None,
    log: Log,
) -> ExportOptions:
    """Refuse drafts the target's precision or the profile rules out; the options with the
    profile's context length."""
    derived = [e.name for e in entries if e.kind.export == registry.EXPORT_QUANTIZED]
    if options.precision in QUANTIZED and derived:
        raise ExportError(
            f"--draft {derived[0]} quantizes the target's graph, which --precision "
            f"{options.precision} already made of quantized blocks",
            "use a smaller model as the draft, or ngram, with a quantized target",
        )
    if profile is None:
        return options
    options = dataclasses.replace(options, max_length=profile.max_context)
    log(f"profile {profile.name}: {profile.description}")
    plan_pair(profile, target, entries, options.engines, log)
    cpu_only = [e.name for e in entries if not e.kind.fp16]
    if profile.precision == "fp16" and cpu_only:
        raise ExportError(
            f"{'/'.join(cpu_only)} drafts are CPU drafts (ONNX Runtime quantization ops) and "
            "need an fp32 profile",
            "use a model draft or ngram with fp16 profiles",
        )
    return options


def _preflight(
    output: Path,
    target: str,
    entries: list[DraftEntry],
    options: ExportOptions,
    profile: Profile | None,
    log: Callable[[str], None],
) -> None:
    """The export's disk, memory and time, estimated from the configs; refused if they do not
    fit (a source whose config cannot be read is left to the loader, which says why)."""
    precision = target_precision(options, profile)
    try:
        est = estimate(
            target,
            entries,
            precision,
            options.draft_precision or precision,
            options.batched,
            options.check_part_bytes,
        )
    except ExportError:
        return
    preflight(output, est, log)


KERNEL_NAMES = {
    "specx": "specx kernels (GGUF blocks as stored)",
    "ort": "ONNX Runtime's MatMulNBits",
}


@dataclass
class PairGraphs:
    """Exports the pair's model graphs: each traced, checked against its source and timed."""

    folder: Path
    options: ExportOptions
    pair_id: str
    precision: str  # the target's weights
    auto_attention: bool  # the attention was not asked for: int8 compute may pick plain
    log: Log
    profile: Profile | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def export(
        self,
        src: SourceModel,
        role: str,
        graph: str,
        *,
        attention: str | None = None,
        taps: tuple[int, ...] = (),
        precision: str | None = None,
        calibrate: bool = True,  # False: a self-draft, judged against the target instead
    ) -> ModelSpec:
        t0 = time.perf_counter()
        options, precision = self.options, precision or self.precision
        gguf = src.weights.gguf
        types = None if gguf is None else {str(t.tensor_type.name) for t in gguf.tensors.values()}
        kernels = resolve_kernels(options, self.profile, precision, types)
        attention = self._attention(src, role, attention or options.attention, precision, kernels)
        if precision in QUANTIZED:
            self.log(f"  {role}: {precision} on {KERNEL_NAMES[kernels]}")
        recipe = GraphRecipe(
            role, graph, options.max_length, self.pair_id, options.opset, precision, attention,
            taps, options.quant_compute, wide_blocks(options, role), kernels,
        )  # fmt: skip
        spec = export_graph(src, self.folder, recipe, self.log)
        self.timings[f"{graph}_export_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        calibration = None
        if precision in QUANTIZED and attention != "batched" and calibrate:  # along a text
            calibration = np.asarray(src.tokenizer(CALIBRATION_TEXT)["input_ids"], dtype=np.int64)
        parity = spec.parity | check_graph(
            src, self.folder, spec, options.check_k, self.log, calibration,
            options.check_part_bytes,
        )  # fmt: skip
        self.timings[f"{graph}_parity_s"] = time.perf_counter() - t0
        return dataclasses.replace(spec, parity=parity)

    def _attention(
        self, src: SourceModel, role: str, attention: str, precision: str, kernels: str
    ) -> str:
        """The attention a graph gets: plain where GroupQueryAttention cannot serve it. On the
        specx kernels the graph takes their own GroupQueryAttention, whose rows do not depend
        on the pass's width (graph/trace.py own_attention)."""
        int8_compute = precision in QUANTIZED and self.options.quant_compute == "int8"
        if self.auto_attention and attention == "gqa" and int8_compute and kernels != "specx":
            # GroupQueryAttention sums a K-token pass in another order than a one-token pass;
            # int8 activation rounding turns those last bits into different tokens. Plain
            # attention's passes are bit-identical (every int4/int8 export records it:
            # checks/parity.py quality_figures, passes_max_abs_logit_diff), so speculation
            # stays exact.
            self.log(f"  {role}: plain attention (int8 compute: its passes agree bit for bit)")
            attention = "plain"
        why = src.architecture.gqa_misfit if attention == "gqa" else None
        if why:
            self.log(f"  {role}: {why}, which GroupQueryAttention needs; exporting plain attention")
            attention = "plain"
        return attention


def _export_into(
    folder: Path,
    target: str,
    drafts: list[DraftEntry],
    options: ExportOptions,
    profile: Profile | None,
    log: Callable[[str], None],
    auto_attention: bool = False,
) -> Manifest:
    """The pair's graphs, tokenizer and manifest, written into `folder`: the target, then one
    recipe per draft (draft_recipes.py)."""
    t_start = time.perf_counter()
    precision = target_precision(options, profile)
    graphs = PairGraphs(folder, options, uuid.uuid4().hex, precision, auto_attention, log, profile)
    steps = 1 + len(drafts)
    log(f"[1/{steps}] target: loading {target}")
    tsrc = open_source(target, log)
    graphs.timings["target_load_s"] = tsrc.load_s
    heads = _read_heads(drafts, tsrc)
    target_spec, batched_spec = _export_target(graphs, tsrc, heads)
    tokenizer = _write_tokenizer(folder, tsrc)
    calibration = np.asarray(tsrc.tokenizer(CALIBRATION_TEXT)["input_ids"], dtype=np.int64)
    ctx = DraftContext(
        folder, tsrc, target_spec, heads, options, options.draft_precision or precision,
        graphs.pair_id, calibration, graphs.export, log, graphs.timings,
    )  # fmt: skip
    draft_specs: list[ModelSpec] = []
    for i, entry in enumerate(drafts):
        log(f"[{i + 2}/{steps}] draft {entry.name!r}: {entry.source}")
        spec = export_draft(ctx, entry)
        if spec is not None:
            draft_specs.append(spec)
    del ctx, tsrc
    graphs.timings["total_s"] = time.perf_counter() - t_start
    manifest = Manifest(
        format_version=contract.format_version_for(draft_specs, target_spec),
        pair_id=graphs.pair_id,
        target=target_spec,
        drafts=tuple(draft_specs),
        **tokenizer,
        max_length=min(s.max_length for s in (target_spec, *draft_specs)),
        exporter=_exporter_info(options, graphs.timings),
        default_drafter=default_drafter(drafts),
        profile=profile.to_json() if profile else None,
        batched=batched_spec,
    )
    manifest.write(folder)
    log(f"done in {graphs.timings['total_s']:.1f} s")
    return manifest


def _write_tokenizer(folder: Path, tsrc: SourceModel) -> dict[str, Any]:
    """The target's tokenizer written beside the graphs; what the manifest says of it."""
    tsrc.tokenizer.backend_tokenizer.save(str(folder / contract.TOKENIZER_FILE))
    return {
        "tokenizer": contract.TOKENIZER_FILE,
        "tokenizer_vocab_size": len(tsrc.tokenizer),
        "special_tokens": special_tokens(tsrc),
        "chat_template": chat_template(tsrc),
    }


def _export_target(
    graphs: PairGraphs, tsrc: SourceModel, heads: dict[str, HeadCheckpoint]
) -> tuple[ModelSpec, ModelSpec | None]:
    """The target's graph (returning the features the heads read) and, if asked, its batched
    graph."""
    taps = next(iter(heads.values())).cfg.taps if heads else ()
    if taps:
        graphs.log(f"  target: also returns its hidden states {list(taps)} for the feature draft")
    target_spec = graphs.export(tsrc, "target", "target.onnx", taps=taps)
    if not graphs.options.batched:
        return target_spec, None
    graphs.log("  target: the batched graph (several sequences per pass)")
    batched = graphs.export(tsrc, "target", BATCHED_GRAPH, attention="batched", taps=taps)
    parity = check_batch_parity(tsrc, graphs.folder, batched, graphs.log)
    return target_spec, dataclasses.replace(
        batched, name="batched", parity=parity | {"single": batched.parity}
    )


def _read_heads(drafts: list[DraftEntry], tsrc: SourceModel) -> dict[str, HeadCheckpoint]:
    """The feature heads among the drafts, by name; they must read the same target layers (the
    target graph has one features output)."""
    wanted = [e for e in drafts if e.kind.export == registry.EXPORT_HEAD]
    if wanted and not tsrc.architecture.llama_lineage:
        raise ExportError(
            "feature drafts (EAGLE heads) need a target of the Llama lineage, not gpt2",
            "use a model draft, int8/int4 or ngram with this target",
        )
    layers = tsrc.architecture.num_layers
    heads = {e.name: read_head(e.source, layers) for e in wanted}
    taps = {h.cfg.taps for h in heads.values()}
    if len(taps) > 1:
        raise ExportError(
            f"the feature drafts read different target layers ({sorted(taps)})",
            "export one feature draft per artifact, or heads trained on the same layers",
        )
    return heads


def _exporter_info(options: ExportOptions, timings: dict[str, float]) -> dict[str, Any]:
    return {
        "versions": _versions(),
        "options": dataclasses.asdict(options),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

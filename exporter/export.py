"""`export_pair`: a target and its drafts -> one artifact folder, written atomically.

Every graph is written into a hidden temporary folder beside the output, checked against its
source model, and the folder is renamed into place only at the end.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.checks.parity import CHECK_PART_BYTES, check_batch_parity, check_graph
from specx.exporter.drafts import DraftEntry, default_drafter, resolve_drafts
from specx.exporter.graph.modules import gqa_unsupported
from specx.exporter.graph.trace import export_graph
from specx.exporter.heads.export import check_head_parity, export_head
from specx.exporter.heads.feature_head import HeadCheckpoint, build_head, read_head
from specx.exporter.planning.preflight import estimate, preflight
from specx.exporter.planning.profile import plan_pair
from specx.exporter.staging import StagedFolder
from specx.exporter.tensorrt.engines import build_engines
from specx.exporter.weights.gguf import parsed_once
from specx.exporter.weights.load import (
    SourceModel,
    chat_template,
    check_pair,
    open_source,
    special_tokens,
)
from specx.exporter.weights.nbits import (
    COMPUTE,
    PRECISIONS,
    QUANTIZED,
    WIDE_BLOCKS,
    WIDE_BLOCKS_DEFAULT,
)
from specx.exporter.weights.quantize import (
    CALIBRATION_TEXT,
    derive_quantized_draft,
    judge_quantized_draft,
)
from specx.exporter.weights.sources import pin
from specx.profiles import Profile, load_profile
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.backends.trt_session import import_tensorrt
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError

MIN_OPSET, MAX_OPSET = 14, 20
BATCHED_GRAPH = "target.batched.onnx"


@dataclass(frozen=True)
class ExportOptions:
    max_length: int = 2048  # cache capacity (positions) of the exported pair
    check_k: int = 4  # the verify width checked for parity is K + 1
    # A graph with more weights is checked in layer-range parts of at most this many bytes,
    # one part in ONNX Runtime at a time (checks/parts.py): the export's memory peak on big models
    check_part_bytes: int = CHECK_PART_BYTES
    opset: int = 17
    force: bool = False  # replace an existing output folder
    profile: str | None = None  # a built-in profile name or a .toml path: limits, precision
    engines: bool = False  # also build TensorRT engines (needs TensorRT and a GPU)
    # "gqa": ONNX Runtime's in-place GroupQueryAttention (fast on CPU/CUDA, no per-step cache
    # copy); "plain": standard ONNX ops only (what TensorRT parses); "auto": plain for profiles
    # that build TensorRT engines, gqa otherwise.
    attention: str = "auto"
    # Also export the target as a "batched" graph (target.batched.onnx): several sequences at
    # their own lengths per pass, for batched serving (runtime/batch/decoder.py).
    batched: bool = False
    # Weights of the target ("fp32", "fp16", "int8", "int4"; None: the profile's, else fp32)
    # and of model drafts (None: the target's). int4/int8 carry a GGUF source's own blocks.
    precision: str | None = None
    draft_precision: str | None = None
    # How int4/int8 graphs multiply (nbits.COMPUTE): "int8" activations (fast; with plain
    # attention, picked for it, K-token and one-token passes are bit-identical) or "fp32"
    # (dequantized weights: close to the float32 source, far slower).
    quant_compute: str = "int8"
    # What becomes of a GGUF's blocks wider than the precision (nbits.WIDE_BLOCKS) in the target
    # and in drafts; None: nbits.WIDE_BLOCKS_DEFAULT (carry the target's, requantize all of a
    # draft's).
    wide_blocks: str | None = None
    draft_wide_blocks: str | None = None


def wide_blocks(options: ExportOptions, role: str) -> str:
    """What becomes of GGUF blocks wider than the precision in a graph of `role`."""
    chosen = options.wide_blocks if role == "target" else options.draft_wide_blocks
    return chosen or WIDE_BLOCKS_DEFAULT[role]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("specx", "torch", "transformers", "onnx", "onnxruntime", "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def resolve_attention(options: ExportOptions, profile: Profile | None) -> str:
    if options.attention not in ("auto", "gqa", "plain"):  # batched: ExportOptions.batched
        raise ExportError(
            f"--attention must be auto, gqa or plain, got {options.attention!r}",
            "gqa for ONNX Runtime (CPU, CUDA), plain for TensorRT",
        )
    if options.attention != "auto":
        return options.attention
    uses_tensorrt = profile is not None and profile.tensorrt.enabled
    return "plain" if uses_tensorrt or options.engines else "gqa"


def _validate(output: Path, options: ExportOptions) -> None:
    if options.max_length < 8:
        raise ExportError(f"--max-length must be at least 8, got {options.max_length}")
    if not 1 <= options.check_k <= 16:
        raise ExportError(f"--check-k must be in 1..16, got {options.check_k}")
    if options.check_part_bytes < 1:
        raise ExportError(
            f"the check's part size must be positive, got {options.check_part_bytes} bytes",
            "pass --check-part-size in MB (at least 64)",
        )
    if not MIN_OPSET <= options.opset <= MAX_OPSET:
        raise ExportError(
            f"--opset must be in {MIN_OPSET}..{MAX_OPSET} (what the TorchScript exporter "
            f"writes), got {options.opset}",
            "leave the default, 17",
        )
    precisions = {"--precision": options.precision, "--draft-precision": options.draft_precision}
    for flag, value in precisions.items():
        if value is not None and value not in PRECISIONS:
            raise ExportError(
                f"{flag} must be one of {', '.join(PRECISIONS)}, got {value!r}",
                "int4 for the smallest and fastest graphs on a CPU, fp32 to compare against",
            )
    wide = {"--wide-blocks": options.wide_blocks, "--draft-wide-blocks": options.draft_wide_blocks}
    for flag, value in wide.items():
        if value is not None and value not in WIDE_BLOCKS:
            raise ExportError(
                f"{flag} must be one of {', '.join(WIDE_BLOCKS)}, got {value!r}",
                "carry keeps a GGUF's own numbers; requantize (the body) and requantize-all "
                "(the head and table too) read fewer bytes per token",
            )
    if options.quant_compute not in COMPUTE:
        raise ExportError(
            f"--quant-compute must be one of {', '.join(COMPUTE)}, got {options.quant_compute!r}",
            "int8 for speed, fp32 for passes that agree like float32 graphs",
        )
    if output.exists():
        if not output.is_dir():
            raise ExportError(f"{output} exists and is not a folder", "choose another -o path")
        if not options.force:
            raise ExportError(
                f"{output} already exists", "pass --force to replace it, or choose another -o"
            )


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
    _validate(output, options)
    profile = load_profile(options.profile) if options.profile else None
    auto_attention = options.attention == "auto"
    attention = resolve_attention(options, profile)
    options = dataclasses.replace(options, attention=attention)
    if options.engines and attention != "plain":
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
    entries = resolve_drafts(drafts, target)
    derived = [e.name for e in entries if e.kind.export == registry.EXPORT_QUANTIZED]
    if options.precision in QUANTIZED and derived:
        raise ExportError(
            f"--draft {derived[0]} quantizes the target's graph, which --precision "
            f"{options.precision} already made of quantized blocks",
            "use a smaller model as the draft, or ngram, with a quantized target",
        )
    if profile is not None:
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
    with parsed_once():  # the preflight and the export read each GGUF file's header once
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
    precision = options.precision or (profile.precision if profile else "fp32")
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


def _export_into(
    folder: Path,
    target: str,
    drafts: list[DraftEntry],
    options: ExportOptions,
    profile: Profile | None,
    log: Callable[[str], None],
    auto_attention: bool = False,
) -> Manifest:
    precision = options.precision or (profile.precision if profile else "fp32")
    draft_precision = options.draft_precision or precision
    t_start = time.perf_counter()
    pair_id = uuid.uuid4().hex
    steps = 1 + len(drafts)
    timings: dict[str, float] = {}

    def export_one(
        src: SourceModel,
        role: str,
        graph: str,
        attention: str = options.attention,
        taps: tuple[int, ...] = (),
        precision: str = precision,
        calibrate: bool = True,  # False: a self-draft, judged against the target instead
    ) -> ModelSpec:
        t0 = time.perf_counter()
        int8_compute = precision in QUANTIZED and options.quant_compute == "int8"
        if auto_attention and attention == "gqa" and int8_compute:
            # GroupQueryAttention sums a K-token pass in another order than a one-token pass;
            # int8 activation rounding turns those last bits into different tokens. Plain
            # attention's passes are bit-identical (measured), so speculation stays exact.
            log(f"  {role}: plain attention (int8 compute: its passes agree bit for bit)")
            attention = "plain"
        why = gqa_unsupported(src.model) if attention == "gqa" else None
        if why:
            log(f"  {role}: {why}, which GroupQueryAttention needs; exporting plain attention")
            attention = "plain"
        spec = export_graph(
            src,
            folder,
            role,
            graph,
            options.max_length,
            pair_id,
            options.opset,
            log,
            precision,
            attention,
            taps,
            options.quant_compute,
            wide_blocks(options, role),
        )
        timings[f"{graph}_export_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        calibration = None
        if precision in QUANTIZED and attention != "batched" and calibrate:  # along a text
            calibration = np.asarray(src.tokenizer(CALIBRATION_TEXT)["input_ids"], dtype=np.int64)
        parity = spec.parity | check_graph(
            src, folder, spec, options.check_k, log, calibration, options.check_part_bytes
        )
        timings[f"{graph}_parity_s"] = time.perf_counter() - t0
        return dataclasses.replace(spec, parity=parity)

    log(f"[1/{steps}] target: loading {target}")
    tsrc = open_source(target, log)
    timings["target_load_s"] = tsrc.load_s
    heads = _read_heads(drafts, tsrc)
    taps = next(iter(heads.values())).cfg.taps if heads else ()
    if taps:
        log(f"  target: also returns its hidden states {list(taps)} for the feature draft")
    target_spec = export_one(tsrc, "target", "target.onnx", taps=taps)
    batched_spec = None
    if options.batched:
        log("  target: the batched graph (several sequences per pass)")
        batched_spec = export_one(tsrc, "target", BATCHED_GRAPH, "batched", taps)
        batched_spec = dataclasses.replace(
            batched_spec,
            name="batched",
            parity=check_batch_parity(tsrc, folder, batched_spec, log)
            | {"single": batched_spec.parity},
        )
    tokenizer_size = len(tsrc.tokenizer)
    tsrc.tokenizer.backend_tokenizer.save(str(folder / contract.TOKENIZER_FILE))
    special = special_tokens(tsrc)
    template = chat_template(tsrc)

    calibration = tsrc.tokenizer(CALIBRATION_TEXT)["input_ids"]
    draft_specs: list[ModelSpec] = []
    for i, entry in enumerate(drafts):
        name = entry.name
        log(f"[{i + 2}/{steps}] draft {name!r}: {entry.source}")
        recipe = entry.kind.export
        if recipe == registry.EXPORT_NOTHING:
            log(f"  {entry.kind.summary}: nothing to export")
        elif recipe == registry.EXPORT_QUANTIZED:
            tokens = np.asarray(calibration, dtype=np.int64)
            if entry.kind.name == "int4":  # streamed from the source like any int4 graph
                t0 = time.perf_counter()
                spec = export_one(tsrc, "draft", f"{name}.onnx", precision="int4", calibrate=False)
                spec = dataclasses.replace(spec, name=name)
                took = time.perf_counter() - t0
                spec = judge_quantized_draft(
                    folder, target_spec, spec, tokens, log, took, options.check_part_bytes
                )
            else:  # int8: ONNX Runtime's dynamic quantization of the target's float graph
                spec = derive_quantized_draft(
                    folder, target_spec, entry.kind.name, tokens, name, log
                )
            draft_specs.append(spec)
        elif recipe == registry.EXPORT_HEAD:
            t0 = time.perf_counter()
            model = tsrc.model
            pin(model, [model.get_input_embeddings(), model.get_output_embeddings()], tsrc.weights)
            head = build_head(heads[name], model, target_spec.vocab_size)
            spec = export_head(
                head,
                folder,
                name,
                entry.source,
                target_spec.max_length,
                pair_id,
                options.opset,
                log,
            )
            spec = dataclasses.replace(spec, parity=check_head_parity(head, folder, spec, log))
            timings[f"{name}_export_s"] = time.perf_counter() - t0
            draft_specs.append(spec)
        elif recipe == registry.EXPORT_TARGET:
            log("  the target drafts for itself (shows the mechanics; it cannot speed anything up)")
            draft_specs.append(dataclasses.replace(target_spec, role="draft", name=name))
        else:
            dsrc = open_source(entry.source, log)
            timings[f"{name}_load_s"] = dsrc.load_s
            check_pair(tsrc, dsrc)
            spec = export_one(dsrc, "draft", f"{name}.onnx", precision=draft_precision)
            draft_specs.append(spec)
            del dsrc
    del tsrc

    max_length = min(s.max_length for s in (target_spec, *draft_specs))
    timings["total_s"] = time.perf_counter() - t_start
    manifest = Manifest(
        format_version=contract.format_version_for(draft_specs),
        pair_id=pair_id,
        target=target_spec,
        drafts=tuple(draft_specs),
        tokenizer=contract.TOKENIZER_FILE,
        tokenizer_vocab_size=tokenizer_size,
        special_tokens=special,
        chat_template=template,
        max_length=max_length,
        exporter=_exporter_info(options, timings),
        default_drafter=default_drafter(drafts),
        profile=profile.to_json() if profile else None,
        batched=batched_spec,
    )
    manifest.write(folder)
    log(f"done in {timings['total_s']:.1f} s")
    return manifest


def _read_heads(drafts: list[DraftEntry], tsrc: SourceModel) -> dict[str, HeadCheckpoint]:
    """The feature heads among the drafts, by name; they must read the same target layers (the
    target graph has one features output)."""
    if tsrc.model_type == "gpt2" and any(e.kind.export == registry.EXPORT_HEAD for e in drafts):
        raise ExportError(
            "feature drafts (EAGLE heads) need a target of the Llama lineage, not gpt2",
            "use a model draft, int8/int4 or ngram with this target",
        )
    layers = int(getattr(tsrc.config, "num_hidden_layers", 0))
    heads = {
        e.name: read_head(e.source, layers) for e in drafts if e.kind.export == registry.EXPORT_HEAD
    }
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

"""What the exporter makes for each `--draft` entry: one function per recipe of the drafter
registry (runtime/drafters/registry.py: `DrafterKind.export`), looked up in RECIPES, and the
quantized copies of the target by kind in QUANTIZED. A new drafter's export is one function and
one entry here, or none where it reuses a recipe.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from specx.exporter.drafts import DraftEntry
from specx.exporter.heads.export import check_head_parity, export_head
from specx.exporter.heads.feature_head import HeadCheckpoint, build_head
from specx.exporter.options import ExportOptions
from specx.exporter.weights.load import Log, SourceModel, check_pair, open_source
from specx.exporter.weights.quantize import derive_quantized_draft, judge_quantized_draft
from specx.exporter.weights.sources import pin
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError


class ExportModel(Protocol):
    """Traces one graph of a model into the artifact and checks it (export.py: PairGraphs)."""

    def __call__(
        self, src: SourceModel, role: str, graph: str, *, precision: str, calibrate: bool = True
    ) -> ModelSpec: ...


@dataclass(frozen=True)
class DraftContext:
    """What a recipe reads: the folder being written, the target (its source, its graph, its
    feature heads by draft name), the options, and where logs and timings go."""

    folder: Path
    target: SourceModel
    target_spec: ModelSpec
    heads: dict[str, HeadCheckpoint]
    options: ExportOptions
    draft_precision: str  # a model draft's weights
    pair_id: str
    calibration: np.ndarray  # [n] int64: the target's tokens of the calibration text
    export_model: ExportModel
    log: Log
    timings: dict[str, float]  # seconds by step, for the manifest


Recipe = Callable[[DraftContext, DraftEntry], ModelSpec | None]


def export_draft(ctx: DraftContext, entry: DraftEntry) -> ModelSpec | None:
    """The graph made for `entry` (None: its drafter needs none)."""
    recipe = RECIPES.get(entry.kind.export)
    if recipe is None:
        raise ExportError(
            f"the exporter has no recipe {entry.kind.export!r} for the {entry.kind.name} drafter",
            "this is a bug in specx; please report it",
        )
    return recipe(ctx, entry)


def _nothing(ctx: DraftContext, entry: DraftEntry) -> None:
    ctx.log(f"  {entry.kind.summary}: nothing to export")


def _quantized(ctx: DraftContext, entry: DraftEntry) -> ModelSpec:
    """A weight-quantized copy of the target, made as its kind says."""
    return QUANTIZED[entry.kind.name](ctx, entry)


def _int4(ctx: DraftContext, entry: DraftEntry) -> ModelSpec:
    """The target streamed again at int4, like any int4 graph, then judged against the target."""
    t0 = time.perf_counter()
    spec = ctx.export_model(
        ctx.target, "draft", f"{entry.name}.onnx", precision="int4", calibrate=False
    )
    spec = dataclasses.replace(spec, name=entry.name)
    took = time.perf_counter() - t0
    folder, part_bytes = ctx.folder, ctx.options.check_part_bytes
    return judge_quantized_draft(
        folder, ctx.target_spec, spec, ctx.calibration, ctx.log, took, part_bytes
    )


def _int8(ctx: DraftContext, entry: DraftEntry) -> ModelSpec:
    """ONNX Runtime's dynamic quantization of the target's float graph."""
    kind, name = entry.kind.name, entry.name
    return derive_quantized_draft(ctx.folder, ctx.target_spec, kind, ctx.calibration, name, ctx.log)


def _head(ctx: DraftContext, entry: DraftEntry) -> ModelSpec:
    """A feature head's graph (the target's graph already returns its features)."""
    t0 = time.perf_counter()
    model, name, target_spec = ctx.target.model, entry.name, ctx.target_spec
    pin(model, [model.get_input_embeddings(), model.get_output_embeddings()], ctx.target.weights)
    head = build_head(ctx.heads[name], model, target_spec.vocab_size)
    spec = export_head(
        head,
        ctx.folder,
        name,
        entry.source,
        target_spec.max_length,
        ctx.pair_id,
        ctx.options.opset,
        ctx.log,
    )
    spec = dataclasses.replace(spec, parity=check_head_parity(head, ctx.folder, spec, ctx.log))
    ctx.timings[f"{name}_export_s"] = time.perf_counter() - t0
    return spec


def _target(ctx: DraftContext, entry: DraftEntry) -> ModelSpec:
    ctx.log("  the target drafts for itself (shows the mechanics; it cannot speed anything up)")
    return dataclasses.replace(ctx.target_spec, role="draft", name=entry.name)


def _model(ctx: DraftContext, entry: DraftEntry) -> ModelSpec:
    """A second model, traced and checked like the target."""
    dsrc = open_source(entry.source, ctx.log)
    ctx.timings[f"{entry.name}_load_s"] = dsrc.load_s
    check_pair(ctx.target, dsrc)
    graph = f"{entry.name}.onnx"
    return ctx.export_model(dsrc, "draft", graph, precision=ctx.draft_precision)


# registry.EXPORT_* -> what the exporter makes
RECIPES: dict[str, Recipe] = {
    registry.EXPORT_NOTHING: _nothing,
    registry.EXPORT_QUANTIZED: _quantized,
    registry.EXPORT_HEAD: _head,
    registry.EXPORT_TARGET: _target,
    registry.EXPORT_MODEL: _model,
}
# the kinds of registry.EXPORT_QUANTIZED -> how their copy of the target is made
QUANTIZED: dict[str, Callable[[DraftContext, DraftEntry], ModelSpec]] = {
    "int4": _int4,
    "int8": _int8,
}

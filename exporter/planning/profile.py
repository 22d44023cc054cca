"""Before any export work: read the configs, apply the profile's limits, plan the memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from specx.exporter.architecture import describe
from specx.exporter.drafts import DraftEntry
from specx.exporter.weights.load import CONFIG_ERRORS, Log
from specx.profiles import Profile
from specx.profiles.planner import Plan, advice, plan
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError


def read_config(source: str) -> Any:
    """The model's config only (no weights): seconds even for a .gguf file."""
    from transformers import AutoConfig

    path = Path(source).expanduser()
    try:
        if path.suffix.lower() == ".gguf":
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoConfig.from_pretrained(str(path) if path.exists() else source)
    except CONFIG_ERRORS as e:
        raise ExportError(
            f"cannot read the model config of {source}: {str(e).splitlines()[0][:300]}",
            "check the path and its config.json (a hub id needs network access)",
        ) from e


def plan_pair(
    profile: Profile,
    target: str,
    drafts: list[DraftEntry],
    engines: bool,
    log: Log,
) -> Plan:
    """Check the profile against the models and the memory budget; refuse early if it fails."""
    arch = describe(read_config(target), target)
    shapes = [arch.model_shape("target")]
    for d in drafts:
        recipe = d.kind.export
        if recipe == registry.EXPORT_NOTHING:
            continue
        if recipe == registry.EXPORT_QUANTIZED:
            shapes.append(arch.model_shape(d.name, weights=d.kind.name))
        elif recipe == registry.EXPORT_TARGET:
            shared = arch.model_shape(d.name)
            shapes.append(replace(shared, num_parameters=0, embedding_parameters=0))
        else:
            shapes.append(describe(read_config(d.source), d.source).model_shape(d.name))
    for s in shapes:
        if profile.max_context > s.max_positions:
            raise ExportError(
                f"profile {profile.name!r}: max_context {profile.max_context} is above the "
                f"{s.max_positions} positions that {s.name} supports",
                f"use a profile (or a copy of it) with max_context <= {s.max_positions}",
            )
    result = plan(profile, shapes, engines)
    log(result.table())
    if not result.fits:
        raise ExportError(
            f"the pair needs {result.total_mb:.0f} MB but profile {profile.name!r} allows "
            f"{result.budget_mb:.0f} MB",
            advice(result, profile),
        )
    return result

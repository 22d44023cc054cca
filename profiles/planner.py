"""Memory planner: will the pair fit the profile's budget at its maximum context?

Counts, per model: weights at the profile's precision (or the quantized draft's), the KV cache at
max_context x max_batch, and the logits buffer of a prefill chunk; then the runtime workspace and
the TensorRT builder workspace. Everything is computed from the models' configs, before any export
work starts, so that an export that cannot fit is refused in seconds with what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from specx.profiles.profile import Profile

BYTES = {"fp32": 4.0, "fp16": 2.0}
MB = 1024 * 1024


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a model; the exporter fills it from the model's config."""

    name: str
    num_parameters: int
    embedding_parameters: int  # vocab x hidden (read one row per token; kept fp32 in int drafts)
    num_layers: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    weights: str = "profile"  # "profile" (fp32/fp16 per the profile), "int8", "int4"


@dataclass(frozen=True)
class PlanRow:
    item: str
    megabytes: float


@dataclass(frozen=True)
class Plan:
    rows: tuple[PlanRow, ...]
    budget_mb: float
    kv_mb_per_token: float  # all models' caches, per token of context

    @property
    def total_mb(self) -> float:
        return sum(r.megabytes for r in self.rows)

    @property
    def fits(self) -> bool:
        return self.total_mb <= self.budget_mb

    def table(self) -> str:
        width = max(len(r.item) for r in self.rows) + 2
        lines = [f"{'memory plan':<{width}}{'MB':>10}"]
        lines += [f"{r.item:<{width}}{r.megabytes:>10.0f}" for r in self.rows]
        lines.append(f"{'total':<{width}}{self.total_mb:>10.0f}")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"{'budget':<{width}}{self.budget_mb:>10.0f}  ({verdict})")
        return "\n".join(lines)


def weight_bytes(model: ModelShape, precision: str) -> float:
    if model.weights == "profile":
        return model.num_parameters * BYTES[precision]
    body = model.num_parameters - model.embedding_parameters
    per_weight = 1.0 if model.weights == "int8" else 0.5 + 4 / 32  # int4: scales per 32
    head = model.embedding_parameters * 1.0  # the draft's own 8-bit head
    return body * per_weight + model.embedding_parameters * 4.0 + head


def kv_bytes_per_token(model: ModelShape, precision: str, batch: int) -> float:
    cache = "fp16" if precision == "fp16" else "fp32"
    return 2 * model.num_layers * model.kv_heads * model.head_dim * BYTES[cache] * batch


def plan(profile: Profile, models: list[ModelShape], engines: bool) -> Plan:
    rows: list[PlanRow] = []
    per_token = 0.0
    for m in models:
        label = m.weights if m.weights != "profile" else profile.precision
        rows.append(PlanRow(f"{m.name} weights ({label})", weight_bytes(m, profile.precision) / MB))
        kv = kv_bytes_per_token(m, profile.precision, profile.max_batch)
        per_token += kv / MB
        rows.append(
            PlanRow(
                f"{m.name} KV cache ({profile.max_context} tokens)", kv * profile.max_context / MB
            )
        )
        rows.append(
            PlanRow(f"{m.name} logits buffer", profile.prefill_chunk * m.vocab_size * 4 / MB)
        )
    rows.append(PlanRow("runtime workspace", float(profile.workspace_mb)))
    if engines and profile.tensorrt.enabled:
        rows.append(PlanRow("TensorRT workspace", float(profile.tensorrt.workspace_mb)))
    return Plan(tuple(rows), float(profile.budget_mb), per_token)


def advice(result: Plan, profile: Profile) -> str:
    """What to change so that the plan fits."""
    kv_total = result.kv_mb_per_token * profile.max_context
    fixed = result.total_mb - kv_total
    tips = []
    if fixed < result.budget_mb and result.kv_mb_per_token > 0:
        fitting = int((result.budget_mb - fixed) / result.kv_mb_per_token)
        if fitting >= 16:
            tips.append(f"lower max_context to {fitting} tokens or less")
    if profile.precision == "fp32":
        tips.append('use fp16 weights and caches (precision = "fp16")')
    tips.append("use a smaller draft (or --draft int4 / ngram), or a larger budget_mb")
    return "; ".join(tips)

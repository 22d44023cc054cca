"""A deployment profile: its schema, its validation, and how one is found by name or path.

A profile fixes the precision, execution providers, batch and context limits, the K range, the
TensorRT optimization profiles (a prefill profile and a decode/verify profile, min/opt/max of every
dynamic dimension), builder settings and the memory budget. `specx export --profile NAME` applies
one; `specx profiles` lists them; a path to a user's own TOML file works the same way.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specx.runtime.errors import InputError

PRECISIONS = ("fp32", "fp16")
PROVIDERS = ("cpu", "cuda", "tensorrt")
DIMS = ("batch", "seq", "past_len")


class ProfileError(InputError):
    """A profile file is malformed or inconsistent; the message names the field."""


@dataclass(frozen=True)
class Range:
    """min / opt / max of one dynamic dimension in a TensorRT optimization profile."""

    min: int
    opt: int
    max: int


@dataclass(frozen=True)
class ShapeProfile:
    batch: Range
    seq: Range
    past_len: Range


@dataclass(frozen=True)
class TensorRTSettings:
    enabled: bool = False
    workspace_mb: int = 0
    optimization_level: int = 3
    timing_cache: str = "timing.cache"
    prefill: ShapeProfile | None = None
    decode: ShapeProfile | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    precision: str
    providers: tuple[str, ...]
    max_batch: int
    max_context: int
    prefill_chunk: int
    k_min: int
    k_default: int
    k_max: int
    budget_mb: int
    workspace_mb: int
    tensorrt: TensorRTSettings
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _field(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise ProfileError(f"{where}: the field {key!r} is missing", "see profiles/cpu.toml")
    value = data[key]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise ProfileError(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    return value


def _shape_profile(data: dict[str, Any], where: str) -> ShapeProfile:
    ranges = {}
    for dim in DIMS:
        triple = _field(data, dim, list, where)
        if len(triple) != 3 or not all(isinstance(v, int) for v in triple):
            raise ProfileError(f"{where}.{dim} must be [min, opt, max] integers, got {triple}")
        lo, opt, hi = triple
        if not 0 <= lo <= hi:
            raise ProfileError(f"{where}.{dim}: need 0 <= min <= max, got {triple}")
        if not lo <= opt <= hi:
            raise ProfileError(f"{where}.{dim}: opt {opt} is outside [min, max] = [{lo}, {hi}]")
        ranges[dim] = Range(lo, opt, hi)
    return ShapeProfile(**ranges)


def parse_profile(data: dict[str, Any], source: str) -> Profile:
    where = Path(source).name
    spec = data.get("speculation", {})
    memory = data.get("memory", {})
    trt = data.get("tensorrt", {})
    profile = Profile(
        name=_field(data, "name", str, where),
        description=str(data.get("description", "")),
        precision=_field(data, "precision", str, where),
        providers=tuple(_field(data, "providers", list, where)),
        max_batch=_field(data, "max_batch", int, where),
        max_context=_field(data, "max_context", int, where),
        prefill_chunk=int(data.get("prefill_chunk", 128)),
        k_min=_field(spec, "k_min", int, f"{where} [speculation]"),
        k_default=_field(spec, "k_default", int, f"{where} [speculation]"),
        k_max=_field(spec, "k_max", int, f"{where} [speculation]"),
        budget_mb=_field(memory, "budget_mb", int, f"{where} [memory]"),
        workspace_mb=int(memory.get("workspace_mb", 0)),
        tensorrt=TensorRTSettings(
            enabled=bool(trt.get("enabled", False)),
            workspace_mb=int(trt.get("workspace_mb", 0)),
            optimization_level=int(trt.get("optimization_level", 3)),
            timing_cache=str(trt.get("timing_cache", "timing.cache")),
            prefill=_shape_profile(trt["prefill"], f"{where} [tensorrt.prefill]")
            if "prefill" in trt
            else None,
            decode=_shape_profile(trt["decode"], f"{where} [tensorrt.decode]")
            if "decode" in trt
            else None,
        ),
        source=source,
    )
    validate(profile)
    return profile


def validate(p: Profile) -> None:
    """Refuse inconsistent profiles, naming the field and the reason."""
    where = Path(p.source).name or p.name
    if p.precision not in PRECISIONS:
        raise ProfileError(f"{where}: precision {p.precision!r} is not one of {PRECISIONS}")
    unknown = [x for x in p.providers if x not in PROVIDERS]
    if not p.providers or unknown:
        raise ProfileError(f"{where}: providers {list(p.providers)} must be from {PROVIDERS}")
    if p.precision == "fp16" and p.providers[0] == "cpu":
        raise ProfileError(
            f"{where}: fp16 graphs with the cpu provider first",
            "ONNX Runtime's CPU provider lacks fp16 kernels: use fp32, or a GPU provider",
        )
    if p.max_batch < 1:
        raise ProfileError(f"{where}: max_batch must be >= 1, got {p.max_batch}")
    if p.max_context < 16:
        raise ProfileError(f"{where}: max_context must be >= 16, got {p.max_context}")
    if not 1 <= p.prefill_chunk <= p.max_context:
        raise ProfileError(f"{where}: prefill_chunk must be in 1..max_context")
    if not 0 <= p.k_min <= p.k_default <= p.k_max <= 16:
        raise ProfileError(
            f"{where} [speculation]: need 0 <= k_min <= k_default <= k_max <= 16, got "
            f"{p.k_min}, {p.k_default}, {p.k_max}"
        )
    if p.budget_mb <= 0 or p.workspace_mb < 0:
        raise ProfileError(f"{where} [memory]: budget_mb must be > 0 and workspace_mb >= 0")
    trt = p.tensorrt
    if not trt.enabled:
        return
    if trt.prefill is None or trt.decode is None:
        raise ProfileError(
            f"{where} [tensorrt]: enabled engines need [tensorrt.prefill] and "
            "[tensorrt.decode] profiles"
        )
    if not 0 <= trt.optimization_level <= 5:
        raise ProfileError(f"{where} [tensorrt]: optimization_level must be in 0..5")
    for label, shapes in (("prefill", trt.prefill), ("decode", trt.decode)):
        section = f"{where} [tensorrt.{label}]"
        if shapes.batch.max > p.max_batch:
            raise ProfileError(f"{section}: batch max {shapes.batch.max} > max_batch {p.max_batch}")
        if shapes.seq.min < 1:
            raise ProfileError(f"{section}: seq min must be >= 1")
        if shapes.past_len.max + shapes.seq.max > p.max_context:
            raise ProfileError(
                f"{section}: past_len max {shapes.past_len.max} + seq max {shapes.seq.max} "
                f"exceeds max_context {p.max_context}"
            )
    if trt.decode.seq.max < p.k_max + 1:
        raise ProfileError(
            f"{where} [tensorrt.decode]: seq max {trt.decode.seq.max} is below the verify width "
            f"k_max + 1 = {p.k_max + 1}",
            "raise [tensorrt.decode] seq max, or lower [speculation] k_max",
        )
    if trt.prefill.seq.max < p.prefill_chunk:
        raise ProfileError(
            f"{where} [tensorrt.prefill]: seq max {trt.prefill.seq.max} is below prefill_chunk "
            f"{p.prefill_chunk}"
        )


def builtin_names() -> list[str]:
    folder = resources.files("specx.profiles")
    return sorted(f.name[: -len(".toml")] for f in folder.iterdir() if f.name.endswith(".toml"))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist")
        text, source = path.read_text(encoding="utf-8"), str(path)
    elif name_or_path in builtin_names():
        resource = resources.files("specx.profiles").joinpath(f"{name_or_path}.toml")
        text, source = resource.read_text(encoding="utf-8"), f"{name_or_path}.toml"
    else:
        raise ProfileError(
            f"no profile named {name_or_path!r}",
            f"built-in profiles: {', '.join(builtin_names())}; or pass a path to a .toml file",
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{source} is not valid TOML: {e}") from e
    return parse_profile(data, source)

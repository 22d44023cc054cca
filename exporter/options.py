"""What `specx export` is asked to do: one frozen ExportOptions, checked before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specx.exporter.checks.parity import CHECK_PART_BYTES
from specx.exporter.weights.gguf_kernels import FLOAT_TYPES, HELD_BITS
from specx.exporter.weights.nbits import (
    COMPUTE,
    PRECISIONS,
    QUANTIZED,
    WIDE_BLOCKS,
    WIDE_BLOCKS_DEFAULT,
)
from specx.profiles import Profile
from specx.runtime.backends.providers import GPU_PROVIDERS, PROVIDER_ALIASES
from specx.runtime.errors import ExportError
from specx.runtime.kernels import library as kernels_library

KERNELS = ("auto", "specx", "ort")

MIN_OPSET, MAX_OPSET = 14, 20


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
    # Whose kernels int4/int8 graphs run on (KERNELS): "specx" (native/kernels: GGUF blocks as
    # stored, each row bit-identical whatever the pass's width), "ort" (MatMulNBits: GPUs,
    # TensorRT, consumers without the library), "auto" (resolve_kernels: specx's for a GGUF
    # source on a CPU where the library is built; docs/bench/measurements.md, "specx kernels").
    kernels: str = "auto"


def wide_blocks(options: ExportOptions, role: str) -> str:
    """What becomes of GGUF blocks wider than the precision in a graph of `role`."""
    chosen = options.wide_blocks if role == "target" else options.draft_wide_blocks
    return chosen or WIDE_BLOCKS_DEFAULT[role]


def resolve_kernels(
    options: ExportOptions, profile: Profile | None, precision: str, gguf_types: set[str] | None
) -> str:
    """Whose kernels a graph of `precision` runs on: as asked; "auto" takes specx's where the
    kernels library is built, the source is a GGUF file (`gguf_types`: its tensors' types, None
    for other sources) whose every quantized type they hold, activations are int8 and no GPU
    profile or TensorRT engine asks for ONNX Runtime's own ops."""
    if precision not in QUANTIZED or options.kernels == "ort":
        return "ort"
    built = kernels_library.library_built()
    if options.kernels == "specx":
        if not built:
            raise ExportError(
                "--kernels specx needs the specx kernels library, which is not built here",
                "build it with scripts/build_kernels.sh (scripts/setup.sh does), or export with "
                "--kernels ort",
            )
        if options.quant_compute != "int8":
            raise ExportError(
                "the specx kernels multiply with int8 activations only",
                "drop --quant-compute fp32, or export with --kernels ort",
            )
        return "specx"
    on_gpu = options.engines or (
        profile is not None
        and (
            profile.tensorrt.enabled
            or any(PROVIDER_ALIASES.get(p, p) in GPU_PROVIDERS for p in profile.providers)
        )
    )
    held = gguf_types is not None and gguf_types <= {*HELD_BITS, *FLOAT_TYPES}
    usable = built and held and options.quant_compute == "int8" and not on_gpu
    return "specx" if usable else "ort"


def target_precision(options: ExportOptions, profile: Profile | None) -> str:
    """The target's weights: as asked, else the profile's, else fp32."""
    return options.precision or (profile.precision if profile else "fp32")


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


PRECISION_FIX = "int4 for the smallest and fastest graphs on a CPU, fp32 to compare against"
WIDE_BLOCKS_FIX = (
    "carry keeps a GGUF's own numbers; requantize (the body) and requantize-all (the head and "
    "table too) read fewer bytes per token"
)
# Options that name one of a list: (flag, allowed values, what to pick); the attribute is the
# flag's name.
CHOICES = (
    ("--precision", PRECISIONS, PRECISION_FIX),
    ("--draft-precision", PRECISIONS, PRECISION_FIX),
    ("--wide-blocks", WIDE_BLOCKS, WIDE_BLOCKS_FIX),
    ("--draft-wide-blocks", WIDE_BLOCKS, WIDE_BLOCKS_FIX),
    ("--kernels", KERNELS, "specx for GGUF blocks as stored on a CPU, ort for GPUs and TensorRT"),
    (
        "--quant-compute",
        tuple(COMPUTE),
        "int8 for speed, fp32 for passes that agree like float32 graphs",
    ),
)


def validate(output: Path, options: ExportOptions) -> None:
    """Refuse options out of range and an output folder that may not be written."""
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
    for flag, allowed, fix in CHOICES:
        value = getattr(options, flag[2:].replace("-", "_"))
        if value is not None and value not in allowed:
            raise ExportError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}", fix)
    if options.kernels == "specx" and not kernels_library.library_built():
        raise ExportError(
            "--kernels specx needs the specx kernels library, which is not built here",
            "build it with scripts/build_kernels.sh (scripts/setup.sh does), or export with "
            "--kernels ort",
        )
    if output.exists():
        if not output.is_dir():
            raise ExportError(f"{output} exists and is not a folder", "choose another -o path")
        if not options.force:
            raise ExportError(
                f"{output} already exists", "pass --force to replace it, or choose another -o"
            )

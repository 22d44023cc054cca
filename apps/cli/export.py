"""`specx export` and `specx build`: they import the exporter (torch, transformers) inside the
command, so that nothing else loads it."""

from __future__ import annotations

from pathlib import Path

import click

from specx.apps.cli.common import debug_option, user_errors
from specx.runtime.drafters.registry import KINDS

# exporter.nbits.WIDE_BLOCKS (not imported here: the exporter loads torch)
WIDE_BLOCKS = click.Choice(["carry", "requantize", "requantize-all"])


def _export_draft_help() -> str:
    kinds = "; ".join(
        f"{k.keyword or 'PATH'}: {k.summary}" for k in KINDS.values() if k.name != "self"
    )
    return f"Draft (repeatable; the first is the default). {kinds}."


@click.command(name="export")
@click.option("--target", required=True, help="Target: HF folder, .gguf file, or hub id.")
@click.option(
    "--draft",
    "drafts",
    multiple=True,
    help=_export_draft_help(),
)
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@click.option("--max-length", type=int, default=2048, show_default=True, help="Cache capacity.")
@click.option("--check-k", type=int, default=4, show_default=True, help="K of the parity check.")
@click.option(
    "--check-part-size",
    type=click.IntRange(min=64),
    default=1024,
    show_default=True,
    help="MB: a graph with more weights is checked against its source in layer-range parts of "
    "at most this much, one in memory at a time (the same results as a whole-graph check).",
)
@click.option("--force", is_flag=True, help="Replace an existing output folder (atomically).")
@click.option("--opset", type=int, default=17, show_default=True)
@click.option(
    "--profile", default=None, help="Deployment profile: a name (specx profiles) or a TOML."
)
@click.option("--engines", is_flag=True, help="Also build TensorRT engines (GPU + TensorRT).")
@click.option(
    "--attention",
    type=click.Choice(["auto", "gqa", "plain"]),
    default="auto",
    show_default=True,
    help="gqa: ONNX Runtime's in-place attention; plain: standard ONNX (TensorRT).",
)
@click.option(
    "--batched",
    is_flag=True,
    help="Also export the target as a batched graph (several sequences per pass, for serving).",
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "int8", "int4"]),
    default=None,
    help="Target weights (default: the profile's, else fp32). int4/int8: MatMulNBits blocks, "
    "a GGUF's own blocks carried where they map exactly; 8-bit LM head.",
)
@click.option(
    "--draft-precision",
    type=click.Choice(["fp32", "fp16", "int8", "int4"]),
    default=None,
    help="Weights of model drafts (default: the target's).",
)
@click.option(
    "--quant-compute",
    type=click.Choice(["int8", "fp32"]),
    default="int8",
    show_default=True,
    help="How int4/int8 graphs multiply: int8 activations (fast, as llama.cpp; plain attention "
    "then keeps K-token and one-token passes bit-identical) or fp32 (dequantized weights: for "
    "checking against the float32 source; far slower, most at 8 bits).",
)
@click.option(
    "--wide-blocks",
    type=WIDE_BLOCKS,
    default=None,
    help="GGUF blocks wider than --precision (5-, 6-, 8-bit formats at int4): carry them exactly "
    "in 8-bit lanes (default for the target: the file's own numbers), requantize the body's to "
    "the precision's bits (the LM head and table carried), or requantize-all (those too): fewer "
    "bytes read per token.",
)
@click.option(
    "--draft-wide-blocks",
    type=WIDE_BLOCKS,
    default=None,
    help="The same for drafts (default: requantize-all; a draft's weights never change the "
    "output).",
)
@click.option(
    "--kernels",
    type=click.Choice(["auto", "specx", "ort"]),
    default="auto",
    show_default=True,
    help="Whose kernels int4/int8 graphs run on: specx (specx's own, over the GGUF file's "
    "blocks as stored; each verify row bit-identical to a one-token pass; needs the kernels "
    "library: scripts/build_kernels.sh), ort (ONNX Runtime's MatMulNBits: GPUs, TensorRT, "
    "consumers without the library), auto (specx for a GGUF source on a CPU where the library "
    "is built, else ort).",
)
@debug_option
@user_errors
def export_cmd(
    target: str,
    drafts: tuple[str, ...],
    output: Path,
    max_length: int,
    check_k: int,
    check_part_size: int,
    force: bool,
    opset: int,
    profile: str | None,
    engines: bool,
    attention: str,
    batched: bool,
    precision: str | None,
    draft_precision: str | None,
    quant_compute: str,
    wide_blocks: str | None,
    draft_wide_blocks: str | None,
    kernels: str,
    debug: bool,
) -> None:
    """Export a TARGET (and drafts) to an ONNX artifact folder, checked against the source."""
    from specx.runtime.errors import ExportError

    try:
        from specx.exporter import ExportOptions, export_pair
    except ImportError as e:
        raise ExportError(
            f"the exporter's dependencies are missing ({e.name})",
            "pip install 'specx[export]' (install torch first: pip install torch==2.13.0)",
        ) from e
    options = ExportOptions(
        max_length=max_length,
        check_k=check_k,
        check_part_bytes=check_part_size << 20,
        opset=opset,
        force=force,
        profile=profile,
        engines=engines,
        attention=attention,
        batched=batched,
        precision=precision,
        draft_precision=draft_precision,
        quant_compute=quant_compute,
        wide_blocks=wide_blocks,
        draft_wide_blocks=draft_wide_blocks,
        kernels=kernels,
    )
    manifest = export_pair(
        target, list(drafts), output, options, log=lambda m: click.echo(m, err=True)
    )
    click.echo(f"wrote {output} (export {manifest.pair_id})", err=True)


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--profile", default=None, help="Profile (default: the one the artifact was exported with)."
)
@debug_option
@user_errors
def build(artifact: Path, profile: str | None, debug: bool) -> None:
    """Build TensorRT engines for an exported ARTIFACT (on the GPU they will run on)."""
    from specx.runtime.errors import ExportError

    try:
        from specx.exporter.tensorrt.engines import rebuild_engines
    except ImportError as e:
        raise ExportError(
            f"building engines needs specx[export] ({e.name})", "pip install 'specx[export]'"
        ) from e
    rebuild_engines(artifact, profile, log=lambda m: click.echo(m, err=True))

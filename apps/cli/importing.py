"""`specx import`: an artifact from decoder graphs exported elsewhere (apps/importer). Needs the
runtime install only."""

from __future__ import annotations

from pathlib import Path

import click

from specx.apps.cli.common import debug_option, user_errors


@click.command(name="import")
@click.option(
    "--target", required=True, type=click.Path(path_type=Path), help="The target's ONNX folder."
)
@click.option(
    "--draft",
    "drafts",
    multiple=True,
    help="Draft (repeatable; the first is the default): a draft's ONNX folder (NAME=PATH names "
    "it), a specx artifact's model draft as exported (NAME=ARTIFACT: its draft NAME, else its "
    "default), or a model-free drafter (ngram, suffix).",
)
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@click.option(
    "--variant",
    default=None,
    help="Which graph of each folder: model_<VARIANT>.onnx (q4, fp16, ...). [default: model.onnx, "
    "else the only one]",
)
@click.option(
    "--copy", is_flag=True, help="Copy the graphs into the artifact (default: link to them)."
)
@click.option("--max-length", type=int, default=2048, show_default=True, help="Cache capacity.")
@click.option("--check-k", type=int, default=4, show_default=True, help="K of the parity check.")
@click.option("--force", is_flag=True, help="Replace an existing output folder.")
@click.option(
    "--rewrite",
    type=click.Choice(["gqa"]),
    default=None,
    help="gqa: write Optimum graphs with their attention as ONNX Runtime's GroupQueryAttention "
    "(faster per pass; checked against the original; needs the onnx package). [default: the "
    "graphs as exported]",
)
@debug_option
@user_errors
def import_cmd(
    target: Path,
    drafts: tuple[str, ...],
    output: Path,
    variant: str | None,
    copy: bool,
    max_length: int,
    check_k: int,
    force: bool,
    rewrite: str | None,
    debug: bool,
) -> None:
    """Make an artifact from ONNX decoders exported elsewhere (Hugging Face Optimum 1.14+ and
    onnx-community folders: model.onnx, config.json, tokenizer.json), checked; rewritten only on
    request (--rewrite)."""
    from specx.apps.importer import ImportOptions, import_pair

    options = ImportOptions(
        max_length=max_length,
        check_k=check_k,
        copy=copy,
        variant=variant,
        force=force,
        rewrite=rewrite,
    )
    import_pair(target, list(drafts), output, options, lambda line: click.echo(line, err=True))

"""`specx distill`: train a feature draft (EAGLE-3-style head) for a target that has none. It
imports the exporter (torch, transformers) inside the command, like `specx export`."""

from __future__ import annotations

from pathlib import Path

import click

from specx.apps.cli.common import debug_option, user_errors


@click.command()
@click.argument("target")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Head folder.")
@click.option(
    "--prompts",
    "prompts",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Your prompts (one per line, JSON lines with 'prompt', or a JSON list); repeatable. "
    "Default: the prompt set specx ships (chat, code, grounded tasks).",
)
@click.option(
    "--text",
    "texts",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Text files to learn the target's predictions on, as they are; repeatable.",
)
@click.option(
    "--max-prompts",
    type=int,
    default=None,
    help="Use at most N first-round prompts, sampled (0: all). Default: all of yours, 700 of the "
    "shipped templated set.",
)
@click.option(
    "--self-prompts",
    type=int,
    default=800,
    show_default=True,
    help="Requests the target writes itself (its chat template's user turn, sampled), added to "
    "the shipped prompts; 0: none.",
)
@click.option("--max-new-tokens", type=int, default=160, show_default=True, help="Per answer.")
@click.option(
    "--grounded",
    type=int,
    default=240,
    show_default=True,
    help="Grounded tasks over the target's own answers (shipped prompt set only).",
)
@click.option("--draft-vocab", type=int, default=8192, show_default=True, help="0: all ids.")
@click.option(
    "--steps", type=int, default=3, show_default=True, help="Draft tokens unrolled in training."
)
@click.option(
    "--train-minutes",
    type=float,
    default=30.0,
    show_default=True,
    help="Training time budget (training stops at this or --max-epochs, whichever comes first; "
    "the learning rate decays to that bound).",
)
@click.option(
    "--max-epochs",
    type=int,
    default=20,
    show_default=True,
    help="Passes over the training data at most (a bound that does not depend on the machine).",
)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--lr", type=float, default=2e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue the run in OUTPUT (data and checkpoint).")
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="auto: a GPU when there is one.",
)
@click.option(
    "--generator",
    type=click.Choice(["auto", "runtime", "transformers"]),
    default="auto",
    show_default=True,
    help="Who generates the answers: specx's runtime (CPU: an exported graph that records the "
    "features in the same passes) or transformers (GPU); auto: the runtime where it can run.",
)
@click.option(
    "--generate-rows", type=int, default=16, show_default=True, help="Runtime: sequences a pass."
)
@debug_option
@user_errors
def distill(
    target: str,
    output: Path,
    prompts: tuple[Path, ...],
    texts: tuple[Path, ...],
    max_prompts: int | None,
    self_prompts: int,
    max_new_tokens: int,
    grounded: int,
    draft_vocab: int,
    steps: int,
    train_minutes: float,
    max_epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    resume: bool,
    device: str,
    generator: str,
    generate_rows: int,
    debug: bool,
) -> None:
    """Train a feature draft for TARGET (HF folder, .gguf file, or hub id) on its own answers.

    Writes a speculators EAGLE-3 checkpoint to OUTPUT with a held-out acceptance report
    (distill_report.json); add it to an artifact with `specx export --draft eagle=OUTPUT`.
    """
    from specx.runtime.errors import ExportError

    try:
        from specx.exporter.heads.distill.run import DistillOptions
        from specx.exporter.heads.distill.run import distill as run_distill
    except ImportError as e:
        raise ExportError(
            f"distillation needs the exporter's dependencies ({e.name})",
            "pip install 'specx[export]' (install torch first: pip install torch==2.13.0)",
        ) from e
    for name, value, low in (
        ("--max-prompts", max_prompts or 0, 0),
        ("--self-prompts", self_prompts, 0),
        ("--max-new-tokens", max_new_tokens, 1),
        ("--grounded", grounded, 0),
        ("--draft-vocab", draft_vocab, 0),
        ("--max-epochs", max_epochs, 1),
        ("--batch-size", batch_size, 1),
        ("--generate-rows", generate_rows, 1),
    ):
        if value < low:
            raise ExportError(f"{name} must be at least {low}, got {value}")
    if not lr > 0:
        raise ExportError(f"--lr must be positive, got {lr}")
    options = DistillOptions(
        prompts=prompts,
        texts=texts,
        max_prompts=max_prompts,
        self_prompts=self_prompts,
        max_new_tokens=max_new_tokens,
        grounded=grounded,
        draft_vocab=draft_vocab,
        steps=steps,
        train_minutes=train_minutes,
        max_epochs=max_epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        resume=resume,
        device=device,
        generator=generator,
        generate_rows=generate_rows,
    )
    run_distill(target, output, options, log=lambda m: click.echo(m, err=True))

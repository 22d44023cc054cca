"""What `specx distill` is asked to do: one frozen DistillOptions, checked before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specx.runtime.errors import ExportError


@dataclass(frozen=True)
class DistillOptions:
    prompts: tuple[Path, ...] = ()  # the user's prompt files (none: the shipped set)
    texts: tuple[Path, ...] = ()  # the user's text files (read as they are)
    # at most this many first-round prompts, sampled (0: all); None: all of the user's, and
    # SHIPPED_PROMPTS of the shipped templated set (self-written ones come on top)
    max_prompts: int | None = None
    # requests the target writes itself (chat template's user turn, sampled), added to the
    # shipped prompts (not to the user's own)
    self_prompts: int = 800
    max_new_tokens: int = 160  # per answer
    grounded: int = 240  # second-round grounded tasks over the target's own answers
    draft_vocab: int = 8192  # ids the head scores (0 or >= the vocabulary: all)
    steps: int = 3  # training-time-test unroll (draft tokens per position)
    train_minutes: float = 30.0  # training time budget (or max_epochs, whichever comes first)
    max_epochs: int = 20  # the learning rate decays to the bound reached first
    batch_size: int = 8  # sequences per optimizer step
    generate_batch: int = 48  # answers generated together (transformers: one generate call)
    # who generates the answers: "runtime" (specx's own runtime on an exported graph that also
    # records the taps and distributions in the same passes: CPU), "transformers" (batched
    # generate, then one recording pass per sequence: GPU), or "auto" (runtime where it can run)
    generator: str = "auto"
    generate_rows: int = 16  # runtime: sequences per pass
    lr: float = 2e-3
    held_out: float = 0.1  # share of prompts kept out of training, for the report
    seed: int = 0
    resume: bool = False
    checkpoint_every: float = 300.0  # seconds
    device: str = "auto"  # "cpu", "cuda", or auto


def check_options(output: Path, options: DistillOptions) -> None:
    for path in (*options.prompts, *options.texts):
        if not Path(path).is_file():
            raise ExportError(f"{path} does not exist", "pass existing prompt or text files")
    if options.generator not in ("auto", "runtime", "transformers"):
        raise ExportError(
            f"--generator must be auto, runtime or transformers, got {options.generator!r}"
        )
    if options.generate_rows < 1:
        raise ExportError(f"--generate-rows must be at least 1, got {options.generate_rows}")
    if options.steps < 1 or options.steps > 8:
        raise ExportError(f"--steps must be in 1..8, got {options.steps}")
    if options.train_minutes <= 0:
        raise ExportError(f"--train-minutes must be positive, got {options.train_minutes}")
    if not 0.0 <= options.held_out < 0.9:
        raise ExportError(f"--held-out must be in [0, 0.9), got {options.held_out}")
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output} exists and is not a folder", "choose another -o path")
    if output.is_dir() and any(output.iterdir()) and not options.resume:
        raise ExportError(
            f"{output} is not empty", "pass --resume to continue a run there, or choose another -o"
        )

"""`specx distill`: train an EAGLE-3-style feature draft for a target that has none.

1. data (distill/data.py): the target answers prompts greedily (the shipped templates, requests
   it wrote itself: distill/self_prompts.py, grounded tasks over its answers, or the user's);
   the passes (distill/generate.py) or one more pass per sequence record its hidden states at
   three layers (low, middle, high) and its next-token distributions;
2. a draft vocabulary: the most frequent ids of the answers (a reduced LM head is most of what
   makes a head cheap on a small target), with EAGLE-3's d2t/t2d maps;
3. training (distill/train.py) with "training-time test" (EAGLE-3): each position is unrolled
   for `steps` draft tokens, step j reading the head's own output of step j - 1 and attending
   to the true pairs before it plus its own chain, as the drafter does at run time; soft
   cross-entropy against the target's distribution, weighted 0.8^(j-1);
4. a held-out report: per-position acceptance of greedy chain drafts on prompts never trained on,
   overall and per kind of prompt, and the mean tokens per target pass that gives for K;
5. the head in vLLM speculators' EAGLE-3 layout (config.json + model.safetensors:
   feature_head.save_speculators), which `specx export --draft eagle=DIR` reads, and so can vLLM.

Checkpoints (DIR/checkpoint.pt, every `checkpoint_every` s and at the end) and the data cache
(DIR/data.npz) let `--resume` pick up where a run stopped (distill/trainer.py); the options
and their checks: distill/options.py.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.heads.distill.data import (
    Sequence,
    generate_answers,
    grounded_prompts,
    load_sequences,
    read_user_prompts,
    record_target,
    save_sequences,
    shipped_prompts,
    text_windows,
)
from specx.exporter.heads.distill.generate import RuntimeGenerator, runtime_generation_possible
from specx.exporter.heads.distill.options import DistillOptions, check_options
from specx.exporter.heads.distill.self_prompts import self_written_prompts
from specx.exporter.heads.distill.train import held_out_acceptance, tokens_per_pass
from specx.exporter.heads.distill.trainer import Training
from specx.exporter.heads.feature_head import save_speculators
from specx.exporter.weights.load import Log, eos_token_ids, load_source
from specx.runtime.errors import ExportError

DATA_FILE = "data.npz"
REPORT_FILE = "distill_report.json"
# the shipped templated prompts used by default (of 1506): with the self-written requests and
# grounded tasks, enough data for the head to train on within a CPU session (what a run took:
# docs/models-and-drafters.md)
SHIPPED_PROMPTS = 700


@dataclass
class DistillReport:
    target: str
    taps: list[int]
    draft_vocab: int
    parameters: int
    sequences: dict[str, int] = field(default_factory=dict)  # train / held_out
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # data, training, report
    epochs: float = 0.0
    train_loss: float = 0.0
    held_out_acceptance: list[float] = field(default_factory=list)  # conditional, per position
    # the same per kind of prompt (templated, self-written, code, grounded, user, text)
    held_out_by_kind: dict[str, list[float]] = field(default_factory=dict)
    held_out_tokens_per_pass: dict[str, float] = field(default_factory=dict)  # by K
    draft_vocab_coverage: float = 0.0  # share of held-out answer tokens inside the draft vocab


def default_taps(layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers (runtime/artifact/contract.py numbering)."""
    return (min(2, layers - 1), layers // 2, max(0, layers - 3))


def _progress(log: Log) -> Callable[..., Any]:
    """tqdm bars on a terminal (transformers depends on tqdm), quiet ones otherwise."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - transformers installs tqdm
        tqdm = None

    def make(total: int, desc: str, unit: str) -> Any:
        if tqdm is None:
            return _NoBar()
        quiet = not sys.stderr.isatty()  # a log file gets the summary lines only
        return tqdm(
            total=total, desc=f"  {desc}", unit=unit, leave=False, mininterval=2.0, disable=quiet
        )

    return make


class _NoBar:
    def update(self, n: int) -> None:
        """No bar."""

    def close(self) -> None:
        """No bar."""

    def set_postfix_str(self, s: str) -> None:
        """No bar."""


def _split(items: list[Any], held_out: float, seed: int) -> tuple[list[Any], list[Any]]:
    rng = np.random.default_rng(seed)
    keep = rng.random(len(items)) >= held_out
    return [x for x, k in zip(items, keep, strict=True) if k], [
        x for x, k in zip(items, keep, strict=True) if not k
    ]


def collect_data(
    src: Any, taps: tuple[int, ...], options: DistillOptions, log: Log, progress: Any
) -> tuple[list[Sequence], list[Sequence]]:
    """(training sequences, held-out sequences): answers to prompts (first round, then grounded
    tasks over some first-round answers) and text windows; held-out ones come from prompts
    never trained on."""
    eos = eos_token_ids(src)
    rng = np.random.default_rng(options.seed)
    first = _first_prompts(options, rng)
    generator = _runtime_generator(src, taps, options, log)

    def answer(prompts: list[Any]) -> list[Sequence]:
        t0 = time.perf_counter()
        if generator is not None:
            out = generator(prompts, options.max_new_tokens, eos, progress)
        else:
            out = generate_answers(
                src, prompts, options.max_new_tokens, options.generate_batch, eos, log, progress
            )
        seconds = time.perf_counter() - t0
        for sequence, prompt in zip(out, prompts, strict=True):
            sequence.kind = prompt.kind
        tokens = sum(len(s.ids) - s.first_label for s in out)
        log(f"    {tokens} answer tokens in {seconds:.0f} s ({tokens / seconds:.0f} tokens/s)")
        return out

    sequences: dict[str, list[Sequence]] = {"train": [], "held": []}
    try:
        if not options.prompts and not options.texts and options.self_prompts:
            t0 = time.perf_counter()
            first += self_written_prompts(
                src, options.self_prompts, eos, generator, options.generate_batch,
                options.seed, log, progress,
            )  # fmt: skip
            log(f"    written in {time.perf_counter() - t0:.0f} s")
        train_prompts, held_prompts = _split(first, options.held_out, options.seed)
        for part, prompts in (("train", train_prompts), ("held", held_prompts)):
            if not prompts:
                continue
            log(f"  {part}: the target answers {len(prompts)} prompts")
            answers = answer(prompts)
            sequences[part] += answers
            if not options.prompts and options.grounded:
                grounded = _grounded(src, answers, prompts, part == "held", options, rng)
                if grounded:
                    log(f"  {part}: {len(grounded)} grounded tasks over the target's own answers")
                    sequences[part] += answer(grounded)
    finally:
        if generator is not None:
            generator.close()
    return _with_texts(src, sequences, taps, options, generator is None, log, progress)


def _first_prompts(options: DistillOptions, rng: np.random.Generator) -> list[Any]:
    """The first round's prompts: the user's, none (texts only) or the shipped set, sampled
    down to options.max_prompts."""
    if options.prompts:
        first = read_user_prompts(list(options.prompts))
    elif options.texts:
        first = []
    else:
        chat, code = shipped_prompts()
        first = chat + code
    most = options.max_prompts
    if most is None:
        most = 0 if options.prompts else SHIPPED_PROMPTS
    if most and len(first) > most:
        first = [first[i] for i in sorted(rng.choice(len(first), most, False))]
    return first


def _grounded(
    src: Any,
    answers: list[Sequence],
    prompts: list[Any],
    held: bool,
    options: DistillOptions,
    rng: np.random.Generator,
) -> list[Any]:
    """Grounded tasks over some of the target's longer chat answers (a held-out share of them
    for held-out prompts)."""
    chat_answers = [
        src.tokenizer.decode(s.ids[s.first_label :], skip_special_tokens=True).strip()
        for s, p in zip(answers, prompts, strict=True)
        if p.chat
    ]
    passages = [a for a in chat_answers if len(a) > 80]
    share = max(1, round(options.grounded * options.held_out)) if held else options.grounded
    picked = [passages[i] for i in rng.permutation(len(passages))[:share]]
    return grounded_prompts(picked, options.seed)


def _with_texts(
    src: Any,
    sequences: dict[str, list[Sequence]],
    taps: tuple[int, ...],
    options: DistillOptions,
    unrecorded: bool,
    log: Log,
    progress: Any,
) -> tuple[list[Sequence], list[Sequence]]:
    """The answers with the user's text windows added, and the target's hidden states and
    distributions recorded where generation did not record them (`unrecorded`: transformers
    generated)."""
    if options.texts:
        windows = text_windows(src, list(options.texts), 256)
        train, held = _split(windows, options.held_out, options.seed)
        sequences["train"] += train
        sequences["held"] += held
    if not sequences["train"]:
        raise ExportError("no training data", "pass --prompts or --text files with content")
    if unrecorded or options.texts:
        log("  recording the target's hidden states and distributions")
    for part in ("train", "held"):  # what generation did not record already
        # [batch, length, vocab] logits per pass: a batch of 8 long sequences holds GBs on a
        # large vocabulary (docs/bench/measurements.md)
        record_target(src, sequences[part], taps, 8, progress)
    return sequences["train"], sequences["held"]


def _runtime_generator(
    src: Any, taps: tuple[int, ...], options: DistillOptions, log: Log
) -> RuntimeGenerator | None:
    """specx's runtime generates where it can (and where asked to); None: transformers."""
    if options.generator == "transformers":
        return None
    device = next(src.model.parameters()).device.type
    why_not = runtime_generation_possible(src, device)
    if why_not is None:
        return RuntimeGenerator(src, taps, options.generate_rows, log)
    if options.generator == "runtime":
        raise ExportError(f"--generator runtime cannot run here: {why_not}", "use --generator auto")
    log(f"  transformers generates the answers ({why_not})")
    return None


def distill(
    target: str, output: Path, options: DistillOptions | None = None, log: Log = print
) -> DistillReport:
    """Train a feature head for `target` into `output` (see the module's docstring)."""
    import torch

    options = options or DistillOptions()
    check_options(output, options)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu")
        if options.device == "auto"
        else options.device
    )
    torch.manual_seed(options.seed)
    progress = _progress(log)
    t0 = time.perf_counter()
    log(f"loading {target}")
    src = load_source(target, log)
    if not src.architecture.llama_lineage:
        raise ExportError(
            "feature drafts need a target of the Llama lineage, not gpt2",
            "use a model draft, int8/int4 or ngram with this target",
        )
    src.model.to(device)
    taps = default_taps(src.architecture.num_layers)
    output.mkdir(parents=True, exist_ok=True)
    train, held = _data(src, taps, output, options, log, progress)
    data_s = time.perf_counter() - t0
    run = Training.start(src, taps, train, output, options, device, log)
    log(
        f"  head: {run.parameters / 1e6:.1f}M parameters, reads layers {list(taps)}, scores "
        f"{len(run.draft_ids)} ids; {len(train)} training sequences "
        f"({sum(len(s.ids) for s in train)} tokens), {len(held)} held out"
    )
    epochs = run.train(train, options, progress, log)
    t_report = time.perf_counter()
    report = _report(run, target, taps, train, held, options, epochs)
    report.seconds = {
        "data": round(data_s, 1),
        "training": round(float(run.state["seconds"]), 1),
        "report": round(time.perf_counter() - t_report, 1),
    }
    run.head.to("cpu")
    save_speculators(run.head, output, run.draft_ids, run.vocab, src.model)
    (output / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
    log(
        f"held-out acceptance per position {report.held_out_acceptance} (greedy, conditional); "
        f"tokens per target pass {report.held_out_tokens_per_pass}; "
        f"{report.draft_vocab_coverage:.1%} of held-out answer tokens inside the draft vocabulary"
    )
    for kind, figures in report.held_out_by_kind.items():
        n = sum(s.kind == kind for s in held)
        log(f"  held-out acceptance, {kind} prompts ({n}): {figures}")
    log(f"wrote {output} (speculators EAGLE-3 layout); use: specx export --draft eagle={output}")
    return report


def _data(
    src: Any,
    taps: tuple[int, ...],
    output: Path,
    options: DistillOptions,
    log: Log,
    progress: Any,
) -> tuple[list[Sequence], list[Sequence]]:
    """(training, held-out) sequences: the last run's under --resume, else collected and saved."""
    data_path = output / DATA_FILE
    if options.resume and data_path.is_file():
        log(f"  reading the data of the last run ({data_path})")
        data = load_sequences(data_path)
        n_train = int(json.loads((output / "data.json").read_text())["train"])
        return data[:n_train], data[n_train:]
    train, held = collect_data(src, taps, options, log, progress)
    save_sequences(train + held, data_path)
    (output / "data.json").write_text(json.dumps({"train": len(train)}) + "\n")
    return train, held


def _report(
    run: Training,
    target: str,
    taps: tuple[int, ...],
    train: list[Sequence],
    held: list[Sequence],
    options: DistillOptions,
    epochs: float,
) -> DistillReport:
    """Held-out acceptance of greedy chain drafts, overall and per kind of prompt."""
    head, to_draft, steps, device = run.head, run.to_draft, options.steps, run.device
    conditional, coverage = held_out_acceptance(head, held or train[:16], to_draft, steps, device)
    by_kind: dict[str, list[float]] = {}
    for kind in sorted({s.kind for s in held if s.kind}):
        of_kind = [s for s in held if s.kind == kind]
        figures = held_out_acceptance(head, of_kind, to_draft, steps, device)[0]
        by_kind[kind] = [round(a, 4) for a in figures]
    return DistillReport(
        target=target,
        taps=list(taps),
        draft_vocab=len(run.draft_ids),
        parameters=run.parameters,
        sequences={"train": len(train), "held_out": len(held)},
        tokens={
            "train": sum(len(s.ids) for s in train),
            "held_out": sum(len(s.ids) for s in held),
        },
        epochs=round(epochs, 3),
        train_loss=round(float(run.state["loss"]), 4),
        held_out_acceptance=[round(a, 4) for a in conditional],
        held_out_by_kind=by_kind,
        held_out_tokens_per_pass={
            str(k): round(tokens_per_pass(conditional, k), 3) for k in range(1, steps + 1)
        },
        draft_vocab_coverage=round(coverage, 4),
    )

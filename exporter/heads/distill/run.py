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
(DIR/data.npz) let `--resume` pick up where a run stopped.
"""

from __future__ import annotations

import json
import math
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
from specx.exporter.heads.distill.self_prompts import self_written_prompts
from specx.exporter.heads.distill.train import (
    batch_tensors,
    distill_loss,
    draft_vocabulary,
    held_out_acceptance,
    length_batches,
    tokens_per_pass,
)
from specx.exporter.heads.feature_head import FeatureHead, HeadConfig, save_speculators
from specx.exporter.weights.load import Log, eos_token_ids, load_source, model_vocab_size
from specx.runtime.errors import ExportError

DATA_FILE = "data.npz"
CHECKPOINT_FILE = "checkpoint.pt"
REPORT_FILE = "distill_report.json"
# the shipped templated prompts used by default (of 1506): with the self-written requests and
# grounded tasks, enough data for the head to train on within a CPU session (what a run took:
# docs/models-and-drafters.md)
SHIPPED_PROMPTS = 700


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


def head_config(target: Any, taps: tuple[int, ...]) -> HeadConfig:
    """A head shaped like one layer of the target (its heads, MLP width, rotary settings)."""
    cfg = target.config
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    rope = {
        k: getattr(cfg, k)
        for k in ("rope_theta", "rope_scaling", "max_position_embeddings")
        if getattr(cfg, k, None) is not None
    }
    return HeadConfig(
        kind="eagle3",
        layout="speculators",
        hidden_size=hidden,
        num_heads=heads,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
        intermediate_size=int(cfg.intermediate_size),
        rms_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        taps=taps,
        target_hidden=hidden,
        fc_bias=True,
        input_norm=False,
        embed_norm=False,
        head_norm=True,
        norm_before_residual=False,
        rope=rope,
    )


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
    if options.prompts:
        first = read_user_prompts(list(options.prompts))
    elif options.texts:
        first = []
    else:
        chat, code = shipped_prompts()
        first = chat + code
    rng = np.random.default_rng(options.seed)
    most = options.max_prompts
    if most is None:
        most = 0 if options.prompts else SHIPPED_PROMPTS
    if most and len(first) > most:
        first = [first[i] for i in sorted(rng.choice(len(first), most, False))]
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
                chat_answers = [
                    src.tokenizer.decode(s.ids[s.first_label :], skip_special_tokens=True).strip()
                    for s, p in zip(answers, prompts, strict=True)
                    if p.chat
                ]
                passages = [a for a in chat_answers if len(a) > 80]
                share = options.grounded
                if part == "held":
                    share = max(1, round(options.grounded * options.held_out))
                picked = [passages[i] for i in rng.permutation(len(passages))[:share]]
                grounded = grounded_prompts(picked, options.seed)
                if grounded:
                    log(f"  {part}: {len(grounded)} grounded tasks over the target's own answers")
                    sequences[part] += answer(grounded)
    finally:
        if generator is not None:
            generator.close()
    if options.texts:
        windows = text_windows(src, list(options.texts), 256)
        train, held = _split(windows, options.held_out, options.seed)
        sequences["train"] += train
        sequences["held"] += held
    if not sequences["train"]:
        raise ExportError("no training data", "pass --prompts or --text files with content")
    if generator is None or options.texts:
        log("  recording the target's hidden states and distributions")
    for part in ("train", "held"):  # what generation did not record already
        # [batch, length, vocab] logits per pass: 8 x 500 tokens are 0.8 GB on SmolLM2
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
    _check_options(output, options)
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
    if src.model_type == "gpt2":
        raise ExportError(
            "feature drafts need a target of the Llama lineage, not gpt2",
            "use a model draft, int8/int4 or ngram with this target",
        )
    src.model.to(device)
    layers = int(src.config.num_hidden_layers)
    taps = default_taps(layers)
    output.mkdir(parents=True, exist_ok=True)
    data_path = output / DATA_FILE
    if options.resume and data_path.is_file():
        log(f"  reading the data of the last run ({data_path})")
        data = load_sequences(data_path)
        n_train = int(json.loads((output / "data.json").read_text())["train"])
        train, held = data[:n_train], data[n_train:]
    else:
        train, held = collect_data(src, taps, options, log, progress)
        save_sequences(train + held, data_path)
        (output / "data.json").write_text(json.dumps({"train": len(train)}) + "\n")
    data_s = time.perf_counter() - t0
    vocab = model_vocab_size(src)
    draft_ids = draft_vocabulary(train, options.draft_vocab, vocab)
    to_draft = torch.full((vocab,), -1, dtype=torch.long)
    to_draft[torch.from_numpy(draft_ids)] = torch.arange(len(draft_ids))
    to_draft = to_draft.to(device)
    cfg = head_config(src.model, taps)
    embedding = src.model.get_input_embeddings().weight.detach().float()
    lm_rows = src.model.get_output_embeddings().weight.detach().float()[torch.from_numpy(draft_ids)]
    reduced = len(draft_ids) < vocab
    head = FeatureHead(
        cfg, embedding, lm_rows, torch.from_numpy(draft_ids) if reduced else None, vocab
    ).to(device)
    head.embed_tokens.weight.requires_grad_(False)  # the target's, read as it is
    trainable = [p for p in head.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=options.lr, weight_decay=0.0)
    state: dict[str, Any] = {"epoch": 0, "batch": 0, "seconds": 0.0, "loss": float("nan")}
    ckpt_path = output / CHECKPOINT_FILE
    if options.resume and ckpt_path.is_file():
        saved = torch.load(ckpt_path, map_location=device, weights_only=False)
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log(
            f"  resuming at epoch {state['epoch']}, batch {state['batch']} "
            f"({state['seconds']:.0f} s trained)"
        )
    log(
        f"  head: {n_params / 1e6:.1f}M parameters, reads layers {list(taps)}, scores "
        f"{len(draft_ids)} ids; {len(train)} training sequences "
        f"({sum(len(s.ids) for s in train)} tokens), {len(held)} held out"
    )
    budget = options.train_minutes * 60.0
    rng = np.random.default_rng(options.seed + int(state["epoch"]))
    plan = length_batches(train, options.batch_size, rng)
    total_batches = options.max_epochs * len(plan)

    def lr_at(step: int) -> float:  # warm up 20 steps, then cosine to whichever bound comes first
        done = min(1.0, max(state["seconds"] / max(budget, 1.0), step / max(1, total_batches)))
        return (
            options.lr
            * min(1.0, (step + 1) / 20)
            * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
        )

    bar = progress(total=int(budget), desc="training", unit="s")
    bar.update(int(state["seconds"]))
    last_save = time.perf_counter()
    losses: list[float] = []
    head.train()
    while state["epoch"] < options.max_epochs and state["seconds"] < budget:
        if state["batch"] >= len(plan):
            state["epoch"] += 1
            state["batch"] = 0
            rng = np.random.default_rng(options.seed + int(state["epoch"]))
            plan = length_batches(train, options.batch_size, rng)
            continue
        started = time.perf_counter()
        batch = batch_tensors([train[i] for i in plan[state["batch"]]], device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state["epoch"] * len(plan) + state["batch"])
        loss = distill_loss(head, batch, to_draft, options.steps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        state["loss"] = float(np.mean(losses[-50:]))
        state["batch"] += 1
        spent = time.perf_counter() - started
        state["seconds"] += spent
        bar.update(int(state["seconds"]) - bar.n if hasattr(bar, "n") else 0)
        bar.set_postfix_str(f"epoch {state['epoch']} loss {state['loss']:.3f}", refresh=False)
        if time.perf_counter() - last_save > options.checkpoint_every:
            _save_checkpoint(ckpt_path, head, optimizer, state)
            last_save = time.perf_counter()
    bar.close()
    head.eval()
    _save_checkpoint(ckpt_path, head, optimizer, state)
    epochs = state["epoch"] + state["batch"] / max(1, len(plan))
    log(
        f"  trained {state['seconds']:.0f} s: {epochs:.2f} epochs "
        f"(of {total_batches / max(1, len(plan)):.0f} allowed), loss {state['loss']:.3f}"
    )
    t_report = time.perf_counter()
    conditional, coverage = held_out_acceptance(
        head, held or train[:16], to_draft, options.steps, device
    )
    by_kind: dict[str, list[float]] = {}
    for kind in sorted({s.kind for s in held if s.kind}):
        of_kind = [s for s in held if s.kind == kind]
        by_kind[kind] = [
            round(a, 4)
            for a in held_out_acceptance(head, of_kind, to_draft, options.steps, device)[0]
        ]
    report = DistillReport(
        target=target,
        taps=list(taps),
        draft_vocab=len(draft_ids),
        parameters=n_params,
        sequences={"train": len(train), "held_out": len(held)},
        tokens={
            "train": sum(len(s.ids) for s in train),
            "held_out": sum(len(s.ids) for s in held),
        },
        seconds={
            "data": round(data_s, 1),
            "training": round(float(state["seconds"]), 1),
            "report": round(time.perf_counter() - t_report, 1),
        },
        epochs=round(epochs, 3),
        train_loss=round(float(state["loss"]), 4),
        held_out_acceptance=[round(a, 4) for a in conditional],
        held_out_by_kind=by_kind,
        held_out_tokens_per_pass={
            str(k): round(tokens_per_pass(conditional, k), 3) for k in range(1, options.steps + 1)
        },
        draft_vocab_coverage=round(coverage, 4),
    )
    head.to("cpu")
    save_speculators(head, output, draft_ids, vocab, src.model)
    (output / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
    log(
        f"held-out acceptance per position {report.held_out_acceptance} (greedy, conditional); "
        f"tokens per target pass {report.held_out_tokens_per_pass}; "
        f"{coverage:.1%} of held-out answer tokens inside the draft vocabulary"
    )
    for kind, figures in by_kind.items():
        n = sum(s.kind == kind for s in held)
        log(f"  held-out acceptance, {kind} prompts ({n}): {figures}")
    log(f"wrote {output} (speculators EAGLE-3 layout); use: specx export --draft eagle={output}")
    return report


def _save_checkpoint(path: Path, head: Any, optimizer: Any, state: dict[str, Any]) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(
        {"head": head.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, tmp
    )
    tmp.replace(path)


def _check_options(output: Path, options: DistillOptions) -> None:
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

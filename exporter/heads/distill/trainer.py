"""A feature head being trained: its draft vocabulary, optimizer, learning-rate schedule and
checkpoints (the losses it minimizes: distill/train.py)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.architecture import describe
from specx.exporter.heads.distill.data import Sequence
from specx.exporter.heads.distill.options import DistillOptions
from specx.exporter.heads.distill.train import (
    batch_tensors,
    distill_loss,
    draft_vocabulary,
    length_batches,
)
from specx.exporter.heads.feature_head import FeatureHead, HeadConfig
from specx.exporter.weights.load import Log, model_vocab_size

CHECKPOINT_FILE = "checkpoint.pt"


def head_config(target: Any, taps: tuple[int, ...]) -> HeadConfig:
    """A head shaped like one layer of the target (its heads, MLP width, rotary settings)."""
    cfg = target.config
    arch = describe(cfg)
    rope = {
        k: getattr(cfg, k)
        for k in ("rope_theta", "rope_scaling", "max_position_embeddings")
        if getattr(cfg, k, None) is not None
    }
    return HeadConfig(
        kind="eagle3",
        layout="speculators",
        hidden_size=arch.hidden_size,
        num_heads=arch.num_heads,
        kv_heads=arch.kv_heads,
        head_dim=arch.head_dim,
        intermediate_size=arch.intermediate_size,
        rms_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        taps=taps,
        target_hidden=arch.hidden_size,
        fc_bias=True,
        input_norm=False,
        embed_norm=False,
        head_norm=True,
        norm_before_residual=False,
        rope=rope,
    )


@dataclass
class Training:
    """A head being trained: its draft vocabulary, optimizer and progress (checkpointed)."""

    head: Any  # FeatureHead
    draft_ids: np.ndarray  # [draft_vocab] target ids the head scores
    to_draft: Any  # [vocab] long: a target id's draft id, -1 outside the draft vocabulary
    vocab: int
    optimizer: Any
    trainable: list[Any]
    state: dict[str, Any]  # epoch, batch, seconds trained, recent loss
    checkpoint: Path
    device: Any

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.trainable)

    @classmethod
    def start(
        cls,
        src: Any,
        taps: tuple[int, ...],
        train: list[Sequence],
        output: Path,
        options: DistillOptions,
        device: Any,
        log: Log,
    ) -> Training:
        """A new head shaped like one target layer over the answers' most used ids, resumed
        from the output's checkpoint under --resume."""
        import torch

        vocab = model_vocab_size(src)
        draft_ids = draft_vocabulary(train, options.draft_vocab, vocab)
        to_draft = torch.full((vocab,), -1, dtype=torch.long)
        to_draft[torch.from_numpy(draft_ids)] = torch.arange(len(draft_ids))
        to_draft = to_draft.to(device)
        model = src.model
        embedding = model.get_input_embeddings().weight.detach().float()
        lm_rows = model.get_output_embeddings().weight.detach().float()[torch.from_numpy(draft_ids)]
        reduced = torch.from_numpy(draft_ids) if len(draft_ids) < vocab else None
        head = FeatureHead(head_config(model, taps), embedding, lm_rows, reduced, vocab)
        head = head.to(device)
        head.embed_tokens.weight.requires_grad_(False)  # the target's, read as it is
        trainable = [p for p in head.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=options.lr, weight_decay=0.0)
        state: dict[str, Any] = {"epoch": 0, "batch": 0, "seconds": 0.0, "loss": float("nan")}
        run = cls(
            head, draft_ids, to_draft, vocab, optimizer, trainable, state,
            output / CHECKPOINT_FILE, device,
        )  # fmt: skip
        if options.resume and run.checkpoint.is_file():
            saved = torch.load(run.checkpoint, map_location=device, weights_only=False)
            head.load_state_dict(saved["head"])
            optimizer.load_state_dict(saved["optimizer"])
            run.state = saved["state"]
            log(
                f"  resuming at epoch {run.state['epoch']}, batch {run.state['batch']} "
                f"({run.state['seconds']:.0f} s trained)"
            )
        return run

    def train(
        self, train: list[Sequence], options: DistillOptions, progress: Any, log: Log
    ) -> float:
        """Train within the time budget or max_epochs, whichever comes first (learning rate:
        20 warm-up steps, then cosine to that bound); the epochs trained."""
        state, budget = self.state, options.train_minutes * 60.0
        rng = np.random.default_rng(options.seed + int(state["epoch"]))
        plan = length_batches(train, options.batch_size, rng)
        total_batches = options.max_epochs * len(plan)

        def lr_at(step: int) -> float:
            done = min(1.0, max(state["seconds"] / max(budget, 1.0), step / max(1, total_batches)))
            cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))
            return options.lr * min(1.0, (step + 1) / 20) * cosine

        bar = progress(total=int(budget), desc="training", unit="s")
        bar.update(int(state["seconds"]))
        last_save = time.perf_counter()
        losses: list[float] = []
        self.head.train()
        while state["epoch"] < options.max_epochs and state["seconds"] < budget:
            if state["batch"] >= len(plan):
                state["epoch"] += 1
                state["batch"] = 0
                rng = np.random.default_rng(options.seed + int(state["epoch"]))
                plan = length_batches(train, options.batch_size, rng)
                continue
            lr = lr_at(state["epoch"] * len(plan) + state["batch"])
            self._step([train[i] for i in plan[state["batch"]]], lr, options.steps, losses)
            bar.update(int(state["seconds"]) - bar.n if hasattr(bar, "n") else 0)
            bar.set_postfix_str(f"epoch {state['epoch']} loss {state['loss']:.3f}", refresh=False)
            if time.perf_counter() - last_save > options.checkpoint_every:
                save_checkpoint(self.checkpoint, self.head, self.optimizer, state)
                last_save = time.perf_counter()
        bar.close()
        self.head.eval()
        save_checkpoint(self.checkpoint, self.head, self.optimizer, state)
        epochs = state["epoch"] + state["batch"] / max(1, len(plan))
        log(
            f"  trained {state['seconds']:.0f} s: {epochs:.2f} epochs "
            f"(of {total_batches / max(1, len(plan)):.0f} allowed), loss {state['loss']:.3f}"
        )
        return float(epochs)

    def _step(self, sequences: list[Sequence], lr: float, steps: int, losses: list[float]) -> None:
        """One optimizer step on a batch of sequences (unrolled `steps` draft tokens)."""
        import torch

        state = self.state
        started = time.perf_counter()
        batch = batch_tensors(sequences, self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = distill_loss(self.head, batch, self.to_draft, steps)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        self.optimizer.step()
        losses.append(float(loss.detach()))
        state["loss"] = float(np.mean(losses[-50:]))
        state["batch"] += 1
        state["seconds"] += time.perf_counter() - started


def save_checkpoint(path: Path, head: Any, optimizer: Any, state: dict[str, Any]) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(
        {"head": head.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, tmp
    )
    tmp.replace(path)

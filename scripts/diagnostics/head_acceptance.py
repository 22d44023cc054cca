"""A feature head's acceptance on the bench's prompts, offline: no timing, the same every run.

    python scripts/diagnostics/head_acceptance.py model.gguf HEAD [--workloads chat,code]
        [--max-new-tokens 64] [--steps 4] [--stored]

The target answers each workload's prompts greedily (specx's runtime route of `specx distill`:
an exported gqa graph that records the head's taps and the target's distributions in its
passes); the head (a `specx distill` folder or any checkpoint `--draft eagle=` reads) then
drafts chains from every position of the answers, as `specx distill`'s held-out report does,
and the script prints, per workload, the conditional acceptance per position (greedy: draft j
equals the target's token, given drafts 1..j-1 did), the expected tokens per target pass at each
K and the share of answer tokens inside the head's draft vocabulary. --stored: the same for the
held-out part of the data the head was trained with (HEAD/data.npz), for comparison.

What it is for: telling whether a head generalises to prompts it never saw (what the bench
measures, among timing noise) apart from whether the runtime drafts as trained (the bench's alpha
should agree with these figures). The bench's prompts are only read here, never trained on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def measure(
    target: str,
    head_dir: Path,
    workloads: list[str],
    max_new_tokens: int,
    steps: int,
    stored: bool,
    log: Any = print,
    ranks: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per workload (and the stored held-out data): the figures above. `ranks`, if given, also
    receives each workload's true_token_ranks ([starts, steps]: tree_bound.py)."""
    import torch

    from specx.apps.bench.runner import load_workloads
    from specx.exporter.heads.distill.data import Prompt, load_sequences
    from specx.exporter.heads.distill.generate import RuntimeGenerator
    from specx.exporter.heads.distill.run import _progress, default_taps
    from specx.exporter.heads.distill.train import (
        chain_acceptance,
        tokens_per_pass,
        true_token_ranks,
    )
    from specx.exporter.heads.feature_head import build_head, read_head
    from specx.exporter.weights.load import eos_token_ids, load_source, model_vocab_size

    src = load_source(target, lambda _m: None)
    layers = int(src.config.num_hidden_layers)
    vocab = model_vocab_size(src)
    head = build_head(read_head(head_dir, layers), src.model, vocab).eval()
    to_draft = torch.arange(vocab)
    if head.draft_ids is not None:
        to_draft = torch.full((vocab,), -1, dtype=torch.long)
        to_draft[head.draft_ids] = torch.arange(len(head.draft_ids))
    cpu = torch.device("cpu")

    def figures(sequences: list[Any], name: str = "") -> dict[str, Any]:
        found, coverage = true_token_ranks(head, sequences, to_draft, steps, cpu)
        if ranks is not None and name:
            ranks[name] = found
        conditional = chain_acceptance(found)
        return {
            "acceptance": [round(a, 3) for a in conditional],
            "tokens_per_pass": {
                str(k): round(tokens_per_pass(conditional, k), 3) for k in range(1, steps + 1)
            },
            "coverage": round(coverage, 3),
            "answer_tokens": sum(len(s.ids) - s.first_label for s in sequences),
        }

    results: dict[str, dict[str, Any]] = {}
    specs = load_workloads()
    generator = RuntimeGenerator(src, default_taps(layers), 8, lambda _m: None)
    try:
        for name in workloads:
            spec = specs[name]
            prompts = [Prompt(p, bool(spec.get("chat"))) for p in spec["prompts"]]
            quiet = _progress(lambda _m: None)
            answers = generator(prompts, max_new_tokens, eos_token_ids(src), quiet)
            results[name] = figures(answers, name)
            log(f"{name:10s} {json.dumps(results[name])}")
    finally:
        generator.close()
    if stored:
        data = load_sequences(head_dir / "data.npz")
        n_train = int(json.loads((head_dir / "data.json").read_text())["train"])
        held = data[n_train:]
        results["stored held-out"] = figures(held)
        log(f"{'stored held-out':10s} {json.dumps(results['stored held-out'])}")
        for kind in sorted({s.kind for s in held if s.kind}):  # data kept since kinds were
            results[f"stored {kind}"] = figures([s for s in held if s.kind == kind])
            log(f"{'stored ' + kind:10s} {json.dumps(results[f'stored {kind}'])}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("head", type=Path)
    parser.add_argument("--workloads", default="chat,code,grounded")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--stored", action="store_true")
    args = parser.parse_args()
    measure(
        args.target,
        args.head,
        [w for w in args.workloads.split(",") if w],
        args.max_new_tokens,
        args.steps,
        args.stored,
    )


if __name__ == "__main__":
    main()

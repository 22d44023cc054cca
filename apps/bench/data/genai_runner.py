"""Benchmark peer: greedy generation with ONNX Runtime GenAI, target alone or with a draft model.

Run with the GenAI environment made by scripts/setup_genai.sh (never with .venv):

    .venv-genai/bin/python apps/bench/data/genai_runner.py --target DIR [--draft DIR] [--k K] \
        --prompts FILE.json --max-new-tokens N [--repeats R] [--warmup 1]

DIR is a folder built by `python -m onnxruntime_genai.models.builder` (genai_config.json inside).
FILE.json holds a JSON list of prompts, each a list of token ids (specx tokenizes, so both
engines see identical inputs). Prints ONE JSON object on stdout: per prompt the generated ids and
the tokens/s of every repeat, the median tokens/s over all runs, the GenAI version and whether
speculative decoding was active (with GenAI's counters: rounds, draft/target passes, acceptance).

Timing covers prefill + decode (append_tokens until is_done), not model loading or generator setup.
Greedy; generation stops after N new tokens or at EOS. GenAI leaves the EOS token out of the
sequence (transformers keeps it): a prompt that stopped at EOS shows `"stopped_at_eos": true`
and fewer than N tokens; tokens/s counts the tokens returned.

Speculative decoding (GenAI >= 0.18): a draft/target pair is one model folder whose
genai_config.json has the target's `model.decoder`, a `model.draft` section of the same shape
(the draft's decoder section) and `"speculative": {"max_draft_tokens": K}` at top level. Paths in
it must be relative and stay inside the folder, so the script writes that config into a temporary
folder with symlinks `target/` and `draft/` to the built folders; those are never modified.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime_genai as og

STAT_KEYS = (
    "rounds",
    "draft_forward_passes",
    "target_forward_passes",
    "draft_tokens_proposed",
    "draft_tokens_evaluated",
    "draft_tokens_accepted",
    "tokens_emitted",
)


def speculative_folder(target: Path, draft: Path, k: int, where: Path) -> Path:
    """Write a combined target+draft GenAI folder under `where` (symlinks + genai_config.json)."""
    cfg = json.loads((target / "genai_config.json").read_text())
    draft_cfg = json.loads((draft / "genai_config.json").read_text())
    if cfg["model"]["vocab_size"] != draft_cfg["model"]["vocab_size"]:
        raise SystemExit("target and draft vocabularies differ")
    (where / "target").symlink_to(target.resolve(), target_is_directory=True)
    (where / "draft").symlink_to(draft.resolve(), target_is_directory=True)
    cfg["model"]["decoder"]["filename"] = "target/" + cfg["model"]["decoder"]["filename"]
    cfg["model"]["draft"] = dict(draft_cfg["model"]["decoder"])
    cfg["model"]["draft"]["filename"] = "draft/" + draft_cfg["model"]["decoder"]["filename"]
    cfg["speculative"] = {"max_draft_tokens": k}
    (where / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    return where


def generate(model: og.Model, prompt: list[int], n: int) -> tuple[list[int], float, dict]:
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + n)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    seconds = time.perf_counter() - t0
    tokens = [int(t) for t in gen.get_sequence(0)[len(prompt) :]][:n]
    stats = gen.get_speculative_stats()
    return tokens, seconds, {key: stats.get(key, 0) for key in STAT_KEYS}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (1-16; with --draft)")
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of the first prompt")
    args = ap.parse_args()
    prompts = json.loads(args.prompts.read_text())
    if not prompts or not all(
        isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts
    ):
        raise SystemExit(f"{args.prompts}: expected a JSON list of non-empty lists of token ids")

    with tempfile.TemporaryDirectory(prefix="specx-genai-") as tmp:
        folder = args.target
        if args.draft:
            folder = speculative_folder(args.target, args.draft, args.k, Path(tmp))
        t0 = time.perf_counter()
        model = og.Model(str(folder))
        load_s = time.perf_counter() - t0
        n = args.max_new_tokens
        for _ in range(args.warmup):
            generate(model, prompts[0], n)
        results, rates, totals = [], [], dict.fromkeys(STAT_KEYS, 0)
        for prompt in prompts:
            runs = [generate(model, prompt, n) for _ in range(args.repeats)]
            for _, _, stats in runs:
                for key in STAT_KEYS:
                    totals[key] += stats[key]
            tps = [len(toks) / s for toks, s, _ in runs]
            rates += tps
            tokens = runs[0][0]
            results.append(
                {
                    "prompt_tokens": len(prompt),
                    "tokens": tokens,
                    "new_tokens": len(tokens),
                    "stopped_at_eos": len(tokens) < n,
                    "same_tokens_every_repeat": all(r[0] == tokens for r in runs),
                    "seconds": [round(s, 4) for _, s, _ in runs],
                    "tokens_per_s": [round(r, 2) for r in tps],
                }
            )
        del model

    active = totals["rounds"] > 0 and totals["draft_forward_passes"] > 0
    if args.draft and not active:
        print("warning: a draft was given but GenAI ran no speculative rounds", file=sys.stderr)
    evaluated = totals["draft_tokens_evaluated"]
    out = {
        "engine": "onnxruntime-genai",
        "version": og.__version__,
        "target": str(args.target),
        "draft": str(args.draft) if args.draft else None,
        "speculative": active,
        "k": args.k if args.draft else None,
        "max_new_tokens": n,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "load_s": round(load_s, 3),
        "median_tokens_per_s": round(statistics.median(rates), 2),
        "speculative_stats": dict(
            totals,
            acceptance_rate=(
                round(totals["draft_tokens_accepted"] / evaluated, 4) if evaluated else None
            ),
        ),
        "prompts": results,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

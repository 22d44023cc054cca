"""Whether a change left generation as it was: the same tokens and the same target passes.

    same_tokens.py record ARTIFACT -o before.json    every drafter x K (0, 1, 3, auto), greedy and
                                                     seeded sampling (both verifications), alone
                                                     and in a batch (when the artifact has a
                                                     batched graph): ids and pass counts
    same_tokens.py compare before.json after.json    the records side by side; also reads two
                                                     `specx bench` results.json files

Greedy and seeded output must agree everywhere; pass counts must agree wherever K is fixed
(`-k auto` chooses K from measured times, so its passes may move with the machine while its tokens
may not). One exception: on an artifact whose verify passes are not bit-identical to one-token
passes (int4/int8 graphs on ONNX Runtime's kernels: the record shows it when a prompt's fixed-K
greedy runs disagree with the target alone), greedy output follows the pass widths, and so a
`-k auto` run's tokens may move with the machine too; such a difference is reported as a note,
not counted. Exit 1 when anything differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from specx.runtime import GenerationSettings, Pipeline

PROMPTS = [
    "Write a Python function that reverses a list.",
    "Explain what a KV cache is, in two sentences.",
    "List three prime numbers and say why each is prime.",
]


def digest(ids: list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()[:16]


def suite(pipe: Pipeline, new_tokens: int) -> list[tuple[str, GenerationSettings]]:
    """(label, settings) of every run recorded."""
    runs = [("target", GenerationSettings(max_new_tokens=new_tokens, k=0))]
    drafters = [d for d in pipe.drafter_names if d != "none"]
    for d in drafters:
        for k in (1, 3, "auto"):
            runs.append(
                (f"{d} K={k}", GenerationSettings.of(max_new_tokens=new_tokens, drafter=d, k=k))
            )
        for verification in ("invariant", "rejection"):
            runs.append(
                (
                    f"{d} K=3 T=0.8 {verification}",
                    GenerationSettings.of(
                        max_new_tokens=new_tokens,
                        drafter=d,
                        k=3,
                        temperature=0.8,
                        top_p=0.95,
                        seed=7,
                        verification=verification,
                    ),
                )
            )
    return runs


def record(artifact: Path, new_tokens: int, chat: bool) -> dict[str, Any]:
    pipe = Pipeline.load(artifact)
    out: dict[str, Any] = {"artifact": str(artifact), "records": []}
    runs = suite(pipe, new_tokens)
    for label, settings in runs:
        for i, prompt in enumerate(PROMPTS):
            result = pipe.generate(prompt, settings, chat=chat)
            out["records"].append(_row("alone", label, i, result))
    if pipe.manifest.batched is not None:
        for label, settings in runs:
            results = pipe.generate_batch(PROMPTS, settings, max_batch=len(PROMPTS), chat=chat)
            for i, result in enumerate(results):
                out["records"].append(_row("batch", label, i, result))
    return out


def _row(mode: str, config: str, prompt: int, result: Any) -> dict[str, Any]:
    return {
        "workload": mode,
        "config": config,
        "repeat": 0,
        "prompt": prompt,
        "tokens": result.stats.new_tokens,
        "target_passes": result.stats.target_passes,
        "token_digest": digest(result.token_ids),
    }


def _records(path: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    data = json.loads(path.read_text())
    rows = data.get("records") or data.get("greedy_records", []) + data.get("sampling_records", [])
    return {(r["workload"], r["config"], r["repeat"], r["prompt"]): r for r in rows}


def _width_dependent(records: dict[tuple[Any, ...], dict[str, Any]]) -> set[tuple[str, int]]:
    """(workload, prompt) whose greedy fixed-K runs did not all give the target alone's tokens:
    there the passes are not bit-identical across widths."""
    target = {(k[0], k[3]): r["token_digest"] for k, r in records.items() if k[1] == "target"}
    return {
        (k[0], k[3])
        for k, r in records.items()
        if " K=" in k[1]
        and "auto" not in k[1]
        and " T=" not in k[1]
        and r["token_digest"] != target.get((k[0], k[3]), r["token_digest"])
    }


def compare(before: Path, after: Path) -> int:
    a, b = _records(before), _records(after)
    width_dependent = _width_dependent(a) | _width_dependent(b)
    differ = 0
    for key in sorted(set(a) | set(b), key=str):
        if key not in a or key not in b:
            print(f"only in {'after' if key in b else 'before'}: {key}")
            differ += 1
            continue
        x, y = a[key], b[key]
        fixed_k = "auto" not in str(key[1])
        if x.get("token_digest") != y.get("token_digest"):
            if not fixed_k and (key[0], key[3]) in width_dependent:
                print(f"note: tokens differ: {key} (-k auto on passes that differ by width)")
                continue
            print(f"tokens differ: {key}")
            differ += 1
        elif fixed_k and x.get("target_passes") != y.get("target_passes"):
            print(f"passes differ: {key} {x.get('target_passes')} -> {y.get('target_passes')}")
            differ += 1
    same = len(set(a) & set(b))
    print(f"{same} runs compared, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("artifact", type=Path)
    rec.add_argument("-o", "--output", type=Path, required=True)
    rec.add_argument("-n", "--new-tokens", type=int, default=48)
    rec.add_argument("--plain", action="store_true", help="prompts without the chat template")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "compare":
        return compare(args.before, args.after)
    data = record(args.artifact, args.new_tokens, not args.plain)
    args.output.write_text(json.dumps(data, indent=1))
    print(f"{len(data['records'])} runs recorded in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

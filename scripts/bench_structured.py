#!/usr/bin/env python3
"""What structured output costs: decode tokens/s with and without a JSON Schema, for the target
alone and speculative, on JSON-extraction prompts, in one interleaved run; plus the grammar's
own time per token (masks, matcher walks) beside the step time, and whether every constrained
output parses, validates, and equals the constrained target alone's.

    .venv/bin/python scripts/bench_structured.py build/qwen-int4 -o docs/bench/structured

Greedy; each configuration runs each prompt once per repeat, in a rotating order. Speedups are
taken within a repeat (speculative / target alone, same constraint), then the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from specx.apps.bench.runner import machine_info
from specx.runtime import Grammar, Pipeline
from specx.runtime.constraint import Constraint

TASKS = [
    (
        "Extract the people and their roles from this text.\n\nAt the meeting, Maria Lopez "
        "presented the budget as finance lead, John Smith (hiring manager) discussed the hiring "
        "plan, and Aiko Tanaka, the office manager, answered questions about the new office.",
        {
            "type": "object",
            "properties": {
                "people": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "role": {"type": "string"}},
                        "required": ["name", "role"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["people"],
            "additionalProperties": False,
        },
    ),
    (
        "Turn this invoice into JSON.\n\nInvoice 2024-117 from Nordic Parts AB to Acme Ltd, "
        "dated 3 March 2024: 4 brake pads at 12.50 EUR each, 2 oil filters at 8.90 EUR each, "
        "shipping 15.00 EUR. Payment due within 30 days.",
        {
            "type": "object",
            "properties": {
                "number": {"type": "string"},
                "seller": {"type": "string"},
                "buyer": {"type": "string"},
                "date": {"type": "string"},
                "currency": {"enum": ["EUR", "USD", "SEK"]},
                "lines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "item": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "unit_price": {"type": "number"},
                        },
                        "required": ["item", "quantity", "unit_price"],
                        "additionalProperties": False,
                    },
                },
                "shipping": {"type": "number"},
                "due_days": {"type": "integer"},
            },
            "required": ["number", "seller", "buyer", "date", "currency", "lines"],
            "additionalProperties": False,
        },
    ),
    (
        "Describe this Python function as JSON: its name, parameters with types, return type "
        "and what it does in one sentence.\n\ndef moving_average(values: list[float], window: "
        "int = 3) -> list[float]:\n    return [sum(values[i:i + window]) / window for i in "
        "range(len(values) - window + 1)]",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "parameters": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "type": {"type": "string"},
                            "default": {"type": ["string", "number", "null"]},
                        },
                        "required": ["name", "type"],
                        "additionalProperties": False,
                    },
                },
                "returns": {"type": "string"},
                "summary": {"type": "string"},
            },
            "required": ["name", "parameters", "returns", "summary"],
            "additionalProperties": False,
        },
    ),
    (
        "Classify this product review: its sentiment, a score from 1 to 5, and the product "
        "aspects it mentions.\n\nThe headphones sound great and the battery easily lasts a week, "
        "but the ear cushions started peeling after two months and the app keeps disconnecting.",
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "mixed", "neutral"]},
                "score": {"type": "integer", "minimum": 1, "maximum": 5},
                "aspects": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "aspect": {"type": "string"},
                            "opinion": {"enum": ["positive", "negative"]},
                        },
                        "required": ["aspect", "opinion"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["sentiment", "score", "aspects"],
            "additionalProperties": False,
        },
    ),
]


class GrammarClock:
    """Seconds spent in the grammar (every Constraint method a step calls), by wrapping them."""

    METHODS = ("admit", "mask", "commit", "draft_allowed", "draft_push", "draft_end")

    def __init__(self) -> None:
        self.seconds = 0.0
        for name in self.METHODS:
            setattr(Constraint, name, self._timed(getattr(Constraint, name)))

    def _timed(self, method: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def prompt_text(task: str, schema: dict[str, Any]) -> str:
    return f"{task}\n\nReply with JSON only, following this JSON Schema:\n{json.dumps(schema)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", default="4,auto", help="speculative K values, comma-separated")
    parser.add_argument("--drafter", default=None, help="default: the artifact's")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--compact",
        action="store_true",
        help="JSON without whitespace (default: the model's layout)",
    )
    parser.add_argument("-o", "--out", type=Path, default=None)
    args = parser.parse_args()

    pipe = Pipeline.load(args.artifact, threads=args.threads)
    drafter = args.drafter or pipe.default_drafter
    ks: list[int | str] = [k if k == "auto" else int(k) for k in args.k.split(",")]
    configs = [("target", 0)] + [(f"{drafter} K={k}", k) for k in ks]
    grammars = [Grammar.json_schema(schema, compact=args.compact) for _, schema in TASKS]
    prompts = [pipe.encode_prompt(prompt_text(t, s), chat=True) for t, s in TASKS]
    clock = GrammarClock()
    for g in grammars:  # warm-up: the grammar tokenizer, each session's first passes
        pipe.generate(prompts[0], max_new_tokens=8, k=ks[0], drafter=drafter, grammar=g)

    # (config, constrained) -> repeat -> [tokens, decode_s, grammar_s]
    sums: dict[tuple[str, bool], dict[int, list[float]]] = defaultdict(dict)
    texts: dict[tuple[str, bool, int], str] = {}
    passes: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0.0, 0.0])
    runs = [(name, k, constrained) for name, k in configs for constrained in (False, True)]
    for rep in range(args.repeats):
        for i, (prompt, grammar) in enumerate(zip(prompts, grammars, strict=True)):
            shift = (rep * len(prompts) + i) % len(runs)
            for name, k, constrained in runs[shift:] + runs[:shift]:
                before = clock.seconds
                result = pipe.generate(
                    prompt,
                    max_new_tokens=args.max_new_tokens,
                    k=k,
                    drafter=None if k == 0 else drafter,
                    grammar=grammar if constrained else None,
                )
                stats = result.stats
                acc = sums[(name, constrained)].setdefault(rep, [0.0, 0.0, 0.0])
                acc[0] += stats.new_tokens
                acc[1] += stats.decode_s
                acc[2] += clock.seconds - before
                passes[(name, constrained)][0] += stats.new_tokens
                passes[(name, constrained)][1] += stats.target_passes
                texts[(name, constrained, i)] = result.text
                print(
                    f"repeat {rep + 1} prompt {i + 1} {name} constrained={constrained}: "
                    f"{stats.decode_tokens_per_s:.1f} tok/s",
                    flush=True,
                )

    rows = []
    for name, _k in configs:
        row: dict[str, Any] = {"config": name}
        for constrained in (False, True):
            key = "constrained" if constrained else "free"
            reps = sums[(name, constrained)]
            tps = [t / s for t, s, _ in reps.values()]
            row[f"{key}_tok_s"] = statistics.median(tps)
            row[f"{key}_tokens_per_pass"] = passes[(name, constrained)][0] / max(
                1.0, passes[(name, constrained)][1]
            )
            if name != "target":
                base = sums[("target", constrained)]
                row[f"{key}_speedup"] = statistics.median(
                    (t / s) / (base[r][0] / base[r][1]) for r, (t, s, _) in reps.items()
                )
            if constrained:
                tokens = sum(t for t, _, _ in reps.values())
                grammar_s = sum(g for _, _, g in reps.values())
                decode_s = sum(s for _, s, _ in reps.values())
                row["grammar_ms_per_token"] = 1000 * grammar_s / tokens
                row["grammar_share_of_decode"] = grammar_s / decode_s
        if name != "target":
            row["kept_speedup"] = row["constrained_speedup"] / row["free_speedup"]
        rows.append(row)

    checks = {"valid": 0, "equal_to_target_alone": 0, "outputs": 0}
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    for (name, constrained, i), text in texts.items():
        if not constrained:
            continue
        checks["outputs"] += 1
        try:
            value = json.loads(text)
            if jsonschema is not None:
                jsonschema.validate(value, TASKS[i][1])
            checks["valid"] += 1
        except (json.JSONDecodeError, ValueError) as e:
            print(f"invalid output ({name}, prompt {i + 1}): {e}")
        checks["equal_to_target_alone"] += text == texts[("target", True, i)]

    report = {
        "machine": machine_info(),
        "artifact": str(args.artifact),
        "drafter": drafter,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "compact": args.compact,
        "prompts": len(TASKS),
        "rows": rows,
        "checks": checks,
        "free_valid_json": sum(1 for (n, c, i), t in texts.items() if not c and _parses(t)),
        # what the target alone writes under each schema (the last repeat's)
        "target_constrained_outputs": [texts[("target", True, i)] for i in range(len(TASKS))],
    }
    lines = [
        "| configuration | tok/s free | tok/s constrained | speedup free | speedup constrained "
        "| kept | tokens/pass free / constrained | grammar ms/token (share) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['free_tok_s']:.1f} | {r['constrained_tok_s']:.1f} | "
            f"{r.get('free_speedup', 1.0):.2f}x | {r.get('constrained_speedup', 1.0):.2f}x | "
            f"{r.get('kept_speedup', 1.0):.2f} | {r['free_tokens_per_pass']:.2f} / "
            f"{r['constrained_tokens_per_pass']:.2f} | {r['grammar_ms_per_token']:.2f} "
            f"({100 * r['grammar_share_of_decode']:.1f}%) |"
        )
    table = "\n".join(lines)
    print(table)
    print(json.dumps(checks))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "table.md").write_text(table + "\n")


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


if __name__ == "__main__":
    main()

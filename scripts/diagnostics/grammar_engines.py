#!/usr/bin/env python3
"""Which grammar engine: llguidance (what specx uses) against outlines-core on an artifact's
tokenizer and the JSON-extraction schemas of scripts/bench_structured.py.

For each schema: the time to compile it for this vocabulary (per request), then the time of one
next-token mask and one token advance along a valid answer laid out as a model writes it
(indented JSON, tokenized by the artifact's tokenizer), and whether rolling back 4 tokens works.
outlines-core is not a specx dependency: `pip install outlines-core` to run this.

    .venv/bin/python scripts/diagnostics/grammar_engines.py build/qwen-int4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_structured import TASKS

from specx.runtime import Grammar, Pipeline
from specx.runtime.constraint import WHITESPACE

ANSWERS = [
    {
        "people": [
            {"name": "Maria Lopez", "role": "finance lead"},
            {"name": "John Smith", "role": "hiring manager"},
            {"name": "Aiko Tanaka", "role": "office manager"},
        ]
    },
    {
        "number": "2024-117",
        "seller": "Nordic Parts AB",
        "buyer": "Acme Ltd",
        "date": "2024-03-03",
        "currency": "EUR",
        "lines": [
            {"item": "brake pad", "quantity": 4, "unit_price": 12.5},
            {"item": "oil filter", "quantity": 2, "unit_price": 8.9},
        ],
        "shipping": 15.0,
        "due_days": 30,
    },
    {
        "name": "moving_average",
        "parameters": [
            {"name": "values", "type": "list[float]"},
            {"name": "window", "type": "int", "default": 3},
        ],
        "returns": "list[float]",
        "summary": "Averages each window of values.",
    },
    {
        "sentiment": "mixed",
        "score": 3,
        "aspects": [
            {"aspect": "sound", "opinion": "positive"},
            {"aspect": "battery", "opinion": "positive"},
            {"aspect": "app", "opinion": "negative"},
        ],
    },
]


BACK = 4  # tokens rolled back


def walk(
    mask: Any, advance: Any, tokens: list[int], bits: np.ndarray
) -> tuple[float, float, np.ndarray]:
    """Median seconds of one mask (written into `bits`) and one advance along `tokens`, and the
    mask before the BACK-th last token (what a rollback of BACK tokens must give again)."""
    masks, advances = [], []
    kept = bits
    for i, t in enumerate(tokens):
        t0 = time.perf_counter()
        mask()
        t1 = time.perf_counter()
        advance(t)
        t2 = time.perf_counter()
        masks.append(t1 - t0)
        advances.append(t2 - t1)
        if i == len(tokens) - BACK:
            kept = bits.copy()
    return statistics.median(masks), statistics.median(advances), kept


def rolled_back(mask: Any, kept: np.ndarray, bits: np.ndarray) -> bool:
    """After the engine's rollback of BACK tokens: the mask is the one computed there before."""
    mask()
    return bool(kept.any()) and np.array_equal(bits, kept)


def llguidance_run(pipe: Pipeline, schema: dict[str, Any], tokens: list[int]) -> dict[str, Any]:
    tokenizer = pipe.grammar_tokenizer()
    t0 = time.perf_counter()
    constraint = tokenizer.constraint(Grammar.json_schema(schema))
    compile_s = time.perf_counter() - t0
    matcher = constraint.matcher
    bits = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)

    def mask() -> None:
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)

    mask_s, advance_s, kept = walk(mask, matcher.consume_token, tokens, bits)
    rolled = matcher.rollback(BACK) and rolled_back(mask, kept, bits)
    return {"compile_s": compile_s, "mask_s": mask_s, "advance_s": advance_s, "rollback": rolled}


def outlines_run(pipe: Pipeline, schema: dict[str, Any], tokens: list[int], out: Any) -> None:
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    native = pipe.grammar_tokenizer().native
    eos = pipe.manifest.special_tokens.eos_token_ids[0]
    special = pipe.codec.special_ids
    vocab: dict[bytes, list[int]] = {}
    for i in range(pipe.codec.vocab_size):
        if i not in special:
            vocab.setdefault(bytes(native.decode_bytes([i])), []).append(i)
    t0 = time.perf_counter()
    regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern=WHITESPACE)
    index = outlines_core.Index(regex, outlines_core.Vocabulary(eos, vocab))
    guide = outlines_core.Guide(index)
    compile_s = time.perf_counter() - t0
    bits = np.zeros((pipe.manifest.target.vocab_size + 31) // 32, dtype=np.int32)

    def mask() -> None:
        guide.write_mask_into(bits.ctypes.data, bits.size, 4)

    mask_s, advance_s, kept = walk(mask, guide.advance, tokens, bits)
    guide.rollback_state(BACK)
    rolled = rolled_back(mask, kept, bits)
    out.put({"compile_s": compile_s, "mask_s": mask_s, "advance_s": advance_s, "rollback": rolled})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--timeout", type=float, default=300, help="per outlines-core compile")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    t0 = time.perf_counter()
    pipe.grammar_tokenizer()
    print(
        f"llguidance tokenizer for {pipe.manifest.target.vocab_size} tokens: "
        f"{time.perf_counter() - t0:.2f} s (once per pipeline)"
    )
    print("| schema | engine | compile | mask / token | advance / token | rollback |")
    print("|---|---|---|---|---|---|")
    for n, ((_task, schema), answer) in enumerate(zip(TASKS, ANSWERS, strict=True), 1):
        tokens = pipe.codec.encode(json.dumps(answer, indent=2), add_special_tokens=False).tolist()
        results = {"llguidance": llguidance_run(pipe, schema, tokens)}
        queue: Any = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(
            target=outlines_run, args=(pipe, schema, tokens, queue)
        )
        child.start()
        child.join(args.timeout)
        if child.is_alive():
            child.kill()
            results["outlines-core"] = {"timeout": args.timeout}
        else:
            results["outlines-core"] = queue.get() if not queue.empty() else {"failed": True}
        for engine, r in results.items():
            if "compile_s" in r:
                print(
                    f"| {n} ({len(tokens)} tokens) | {engine} | {r['compile_s'] * 1e3:.1f} ms | "
                    f"{r['mask_s'] * 1e6:.0f} µs | {r['advance_s'] * 1e6:.0f} µs | "
                    f"{'yes' if r['rollback'] else 'no'} |"
                )
            else:
                print(f"| {n} | {engine} | {r} | | | |")


if __name__ == "__main__":
    main()

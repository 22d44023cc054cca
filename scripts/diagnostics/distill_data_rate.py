"""How fast `specx distill` makes its data by each route, on the same prompts, measured.

    python scripts/diagnostics/distill_data_rate.py TARGET [--prompts 48] [--rounds 2]

TARGET: what `specx distill` takes (a GGUF file, a Hugging Face folder). Both routes answer the
same shipped chat prompts (every 15th, 160 new tokens) and record the taps and top-8
distributions `specx distill` trains on: specx's runtime (an exported gqa graph of the target,
16 rows a pass, recording in the same passes) and transformers (batched generate, 48 answers a
call, then one recording pass per sequence). The routes take turns, `--rounds` times; it prints
answer tokens per second of each (medians) and whether their answers agree. Nothing else may run
meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specx.exporter.heads.distill.data import generate_answers, record_target, shipped_prompts
from specx.exporter.heads.distill.generate import RuntimeGenerator
from specx.exporter.heads.distill.run import _progress, default_taps
from specx.exporter.weights.load import eos_token_ids, load_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    args = parser.parse_args()
    src = load_source(args.target, lambda _m: None)
    chat, _ = shipped_prompts()
    prompts = chat[::15][: args.prompts]
    eos = eos_token_ids(src)
    bar = _progress(lambda _m: None)
    taps = default_taps(int(src.config.num_hidden_layers))
    t0 = time.perf_counter()
    runtime = RuntimeGenerator(src, taps, 16, lambda _m: None)
    print(f"runtime route: the target exported and checked in {time.perf_counter() - t0:.0f} s")

    def by_transformers() -> list:
        out = generate_answers(src, prompts, args.max_new_tokens, 48, eos, lambda _m: None, bar)
        record_target(src, out, taps, 8, bar)
        return out

    routes = {
        "runtime": lambda: runtime(prompts, args.max_new_tokens, eos, bar),
        "transformers": by_transformers,
    }
    rates: dict[str, list[float]] = {name: [] for name in routes}
    answers: dict[str, list] = {}
    for _ in range(args.rounds):
        for name, route in routes.items():
            t0 = time.perf_counter()
            answers[name] = route()
            seconds = time.perf_counter() - t0
            tokens = sum(len(s.ids) - s.first_label for s in answers[name])
            rates[name].append(tokens / seconds)
    runtime.close()
    same = sum(
        np.array_equal(a.ids, b.ids)
        for a, b in zip(answers["runtime"], answers["transformers"], strict=True)
    )
    print(
        f"{len(prompts)} prompts, up to {args.max_new_tokens} new tokens; answer tokens/s with the "
        f"recording, median of {args.rounds}:"
    )
    for name, values in rates.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {name:>12}: {statistics.median(values):.1f}  ({each})")
    ratio = statistics.median(rates["runtime"]) / statistics.median(rates["transformers"])
    print(f"  runtime / transformers: {ratio:.2f}x; identical answers: {same} of {len(prompts)}")


if __name__ == "__main__":
    main()

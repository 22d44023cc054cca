"""Pass costs of the batched graph against the single-sequence graph, measured.

    python scripts/diagnostics/batch_costs.py ARTIFACT [--past 100] [--repeats 15] [--one-token]
    python scripts/diagnostics/batch_costs.py ARTIFACT --prefill [--repeats 12]

For rows B in 1, 2, 4, 8 and pass widths S in 1, 2, 3, 5, the median time of one batched pass
(every row at `past` cached positions) for batch rows of 128..1024 positions, next to the gqa
graph's one-sequence pass at the same width. With --one-token instead: the one-token pass over
1, 2, 4, 8 rows (192-position rows) of the target's gqa graph and of every draft model, as the
shared draft passes run them. With --prefill: three joining rows reading 21 prompt tokens each
after a 24-token shared prefix, in one batched pass against three passes of the gqa graph
(interleaved). Prints a table (ms); nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specx.apps.bench.timing import median_ms
from specx.runtime import Pipeline
from specx.runtime.backends.ort_session import use_global_thread_pool


def one_token_rows(pipe: Pipeline, past: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    graphs = [("target", pipe.target.fork())]
    graphs += [(d.name, pipe.new_drafter(d.name).session) for d in pipe.manifest.drafts]
    print(f"one token per row, every row at {past} cached positions; ms, median of {repeats}")
    for name, session in graphs:
        cells = []
        for rows in (1, 2, 4, 8):
            cache = session.new_batch_cache(rows, 192)

            def run(rows: int = rows, cache=cache, session=session) -> None:
                cache.lengths[:] = past
                tokens = rng.integers(0, 1000, (rows, 1))
                session.forward_rows(tokens, np.ones(rows, dtype=np.int64), cache)

            cells.append(f"{rows} rows {median_ms(run, repeats):.1f}")
        print(f"{name:>8}: " + ", ".join(cells))


def joining_rows(pipe: Pipeline, repeats: int, rows: int = 3, tokens: int = 21) -> None:
    single, batched = pipe.target.fork(), pipe.batched_session()
    rng = np.random.default_rng(0)
    cache = batched.new_batch_cache(rows, 128)
    ones = np.array([tokens])

    def apart() -> None:
        for row in range(rows):
            cache.lengths[row] = 24
            single.forward_rows(rng.integers(0, 1000, (1, tokens)), ones, cache, row)

    def together() -> None:
        cache.lengths[:] = 24
        batched.forward_rows(rng.integers(0, 1000, (rows, tokens)), np.full(rows, tokens), cache)

    times: dict[str, list[float]] = {"one batched pass": [], f"{rows} gqa passes": []}
    for _ in range(repeats):  # interleaved, so that drift hits both alike
        for name, fn in zip(times, (together, apart), strict=True):
            t0 = time.perf_counter()
            fn()
            times[name].append(1000 * (time.perf_counter() - t0))
    print(f"{rows} joining rows x {tokens} prompt tokens after 24 cached; ms, median of {repeats}")
    for name, values in times.items():
        print(f"{name:>18}: {statistics.median(values):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--past", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--contexts", default="128,256,512,1024")
    parser.add_argument("--one-token", action="store_true")
    parser.add_argument("--prefill", action="store_true")
    args = parser.parse_args()
    use_global_thread_pool()
    pipe = Pipeline.load(args.artifact)
    if args.one_token:
        one_token_rows(pipe, args.past, args.repeats)
        return
    if args.prefill:
        joining_rows(pipe, args.repeats)
        return
    single = pipe.target.fork()
    batched = pipe.batched_session()
    rng = np.random.default_rng(0)
    widths = (1, 2, 3, 5)
    cache = single.new_cache(args.past + 8)

    def one(s: int) -> None:
        cache.truncate(args.past)
        single.forward(rng.integers(0, 1000, s), cache)

    cache.reset()
    single.prefill(rng.integers(0, 1000, args.past), cache)
    print(f"past {args.past}; ms per pass, median of {args.repeats}")
    print(
        "gqa, 1 sequence: "
        + ", ".join(f"S={s} {median_ms(lambda s=s: one(s), args.repeats):.1f}" for s in widths)
    )
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"{'rows':>4} {'context':>7} " + " ".join(f"{'S=' + str(s):>7}" for s in widths))
    for rows in (1, 2, 4, 8):
        for context in contexts:
            bcache = batched.new_batch_cache(rows, context)
            bcache.lengths[:] = args.past

            def run(s: int, rows: int = rows, bcache=bcache) -> None:
                bcache.lengths[:] = args.past
                tokens = rng.integers(0, 1000, (rows, s))
                batched.forward_rows(tokens, np.full(rows, s), bcache)

            cells = " ".join(f"{median_ms(lambda s=s: run(s), args.repeats):>7.1f}" for s in widths)
            print(f"{rows:>4} {context:>7} {cells}")


if __name__ == "__main__":
    main()

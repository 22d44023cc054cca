"""Which target passes -k auto's batches run, next to speculation off's, at one concurrency.

    python scripts/diagnostics/pass_mix.py ARTIFACT [--concurrency 4] [--repeats 4]
        [--drafter ngram+int8] [--workload chat] [--plain-most 0]

Runs a workload's five prompts (chat unless --workload says) as `specx bench --concurrency`
does (batches of `--concurrency` requests until every prompt ran, 64 new tokens), speculation
off and -k auto in turn (with --plain-most N, also -k auto with `WidthPlanner.PLAIN_MOST` = N;
their order turning by one each repeat; a first repeat warms up and is not counted), and
prints per mode the aggregate tokens/s and every decoding pass it ran, by rows and width: how
many, their seconds, and milliseconds each (`WidthPlanner.observe`, which the decoder calls
after each pass but prefill's). Tells whether -k auto loses in passes of the same kind (the
same rows and width costing more) or in the wider passes it chose, and how much of its wall time
lies outside the decoding passes (prompt reads included). Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

from specx.apps.bench.concurrency import together_batches
from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.backends.ort_session import use_global_thread_pool
from specx.runtime.batch.widths import WidthPlanner
from specx.runtime.settings import GenerationSettings

# mode -> (rows, width) -> [passes, seconds]
passes: defaultdict[str, defaultdict[tuple[int, int], list[float]]] = defaultdict(
    lambda: defaultdict(lambda: [0.0, 0.0])
)
current = ["warm-up"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--drafter", default="ngram+int8")
    parser.add_argument("--workload", default="chat", help="chat, code or grounded")
    parser.add_argument(
        "--plain-most",
        type=int,
        help="also run -k auto with WidthPlanner.PLAIN_MOST set to this (0: every batch step "
        "planned, as before plain runs)",
    )
    args = parser.parse_args()

    observe = WidthPlanner.observe

    def counted(self: WidthPlanner, rows: int, width: int, seconds: float) -> None:
        cell = passes[current[0]][(rows, width)]
        cell[0] += 1
        cell[1] += seconds
        observe(self, rows, width, seconds)

    WidthPlanner.observe = counted  # type: ignore[method-assign]
    use_global_thread_pool()
    pipe = Pipeline.load(args.artifact)
    workload = load_workloads()[args.workload]
    ids = [pipe.encode_prompt(p, bool(workload.get("chat")), None) for p in workload["prompts"][:5]]
    modes = {
        "off": GenerationSettings(max_new_tokens=64, k=0, drafter="none"),
        "auto": GenerationSettings(max_new_tokens=64, k="auto", drafter=args.drafter),
    }
    plain_most = dict.fromkeys(modes, WidthPlanner.PLAIN_MOST)
    if args.plain_most is not None:
        name = f"auto, PLAIN_MOST={args.plain_most}"
        modes[name], plain_most[name] = modes["auto"], args.plain_most
    wall: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    c = args.concurrency
    for repeat in range(args.repeats + 1):
        names = list(modes)
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            current[0] = name if repeat else "warm-up"
            WidthPlanner.PLAIN_MOST = plain_most[name]
            for batch in together_batches(len(ids), c, repeat):
                t0 = time.perf_counter()
                results = pipe.generate_batch([ids[i] for i in batch], modes[name], max_batch=c)
                if repeat:
                    wall[name] += time.perf_counter() - t0
                    tokens[name] += sum(r.stats.new_tokens for r in results)
    print(
        f"{c} requests, {args.repeats} repeats (after one to warm up), "
        f"{args.workload}, 64 new tokens"
    )
    for name in modes:
        total = sum(s for _, s in passes[name].values())
        print(
            f"{name}: {tokens[name] / wall[name]:.1f} tok/s, wall {wall[name]:.2f} s, "
            f"decoding passes {total:.2f} s, the rest {wall[name] - total:.2f} s"
        )
        for (rows, width), (n, s) in sorted(passes[name].items()):
            print(
                f"  {rows} rows x {width} wide: {int(n):5d} passes {s:7.3f} s {s / n * 1e3:7.2f} ms"
            )
    for name in list(modes)[1:]:
        print(f"{name} / off: {tokens[name] / wall[name] / (tokens['off'] / wall['off']):.3f}")


if __name__ == "__main__":
    main()

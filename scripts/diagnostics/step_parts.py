"""Where a batch step's time goes, and what a prompt's unread logits cost, measured.

    python scripts/diagnostics/step_parts.py ARTIFACT [--concurrency 8] [--rounds 3]
    python scripts/diagnostics/step_parts.py ARTIFACT --prefill-logits [--tokens 50] [--repeats 15]

Default: runs the chat workload's prompts as `specx bench --concurrency` does (batch after batch
of `--concurrency` requests until every prompt ran, 64 new tokens, drafter ngram+int8), warmed up
once per mode, then `--rounds` times speculation off and -k auto in turn, and splits the decode
steps' wall time (`BatchDecoder.step`, prefill chunks included) into ONNX Runtime's runs (target
and draft graphs: `InferenceSession.run_with_iobinding`), -k auto's batch planner
(`WidthPlanner.plan`) and the rest (the runtime's own work: decisions, lookups, acceptance,
binding). Medians over rounds, ms per step.

--prefill-logits: a `--tokens`-token prompt read by the target's gqa graph (ms), what its LM head
alone costs for every position ([tokens, hidden] x [hidden, vocab] in numpy, the same shapes),
and the same pass through plain `InferenceSession.run` with every output fetched against the
cache outputs only (ONNX Runtime computes a graph's outputs whether or not they are fetched, so
skipping the prompt's logits would need a graph input). Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnxruntime as ort

from specx.apps.bench.concurrency import together_batches
from specx.apps.bench.runner import load_workloads
from specx.apps.bench.timing import median_ms
from specx.runtime import Pipeline
from specx.runtime.artifact import contract
from specx.runtime.batch.decoder import BatchDecoder
from specx.runtime.batch.widths import WidthPlanner
from specx.runtime.settings import GenerationSettings

PARTS = ("step", "onnxruntime", "planner")
TIMED = (  # what is timed, and as which part
    (BatchDecoder, "step", "step"),
    (ort.InferenceSession, "run_with_iobinding", "onnxruntime"),
    (WidthPlanner, "plan", "planner"),
)


@contextmanager
def timing(seconds: dict[str, float], counts: dict[str, int]) -> Iterator[None]:
    """While open, each TIMED method adds its calls' wall time to `seconds[part]`."""
    saved = []
    for owner, name, part in TIMED:
        inner: Callable[..., Any] = getattr(owner, name)
        saved.append((owner, name, inner, name in vars(owner)))

        def wrapper(*args: Any, _inner: Any = inner, _part: str = part, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                seconds[_part] = seconds.get(_part, 0.0) + time.perf_counter() - t0
                counts[_part] = counts.get(_part, 0) + 1

        setattr(owner, name, wrapper)
    try:
        yield
    finally:
        for owner, name, inner, own in saved:
            if own:
                setattr(owner, name, inner)
            else:  # it was inherited: uncover the base class's again
                delattr(owner, name)


def step_parts(
    pipe: Pipeline,
    prompts: list[np.ndarray],
    concurrency: int,
    rounds: int,
    drafter: str,
    new_tokens: int = 64,
) -> dict[str, dict[str, float]]:
    """Per mode ("off", "-k auto"): medians over rounds of steps, tok/s and ms per step of each
    part (step, onnxruntime, planner, rest)."""

    def run(k: int | str) -> dict[str, float]:
        settings = GenerationSettings(
            max_new_tokens=new_tokens, k=k, drafter="none" if k == 0 else drafter, max_k=4
        )
        seconds: dict[str, float] = {}
        counts: dict[str, int] = {}
        tokens = 0
        with timing(seconds, counts):
            for batch in together_batches(len(prompts), concurrency, 0):
                results = pipe.generate_batch(
                    [prompts[i] for i in batch], settings, max_batch=concurrency
                )
                tokens += sum(r.stats.new_tokens for r in results)
        steps = counts["step"]
        out = {part: 1000 * seconds.get(part, 0.0) / steps for part in PARTS}
        out["rest"] = out["step"] - out["onnxruntime"] - out["planner"]
        out["steps"] = steps
        out["tok/s"] = tokens / seconds["step"]
        return out

    for k in (0, "auto"):  # warm-up: sessions, the planner's cost tables
        run(k)
    measured: dict[str, list[dict[str, float]]] = {"off": [], "-k auto": []}
    for _ in range(rounds):
        for mode, k in (("off", 0), ("-k auto", "auto")):
            measured[mode].append(run(k))
    return {
        mode: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for mode, runs in measured.items()
    }


def print_parts(parts: dict[str, dict[str, float]]) -> None:
    print(
        f"{'mode':>8} {'steps':>6} {'tok/s':>7} {'step':>7} {'ORT':>7} {'planner':>8} {'rest':>7}"
    )
    for mode, med in parts.items():
        print(
            f"{mode:>8} {med['steps']:>6.0f} {med['tok/s']:>7.1f} {med['step']:>7.2f} "
            f"{med['onnxruntime']:>7.2f} {med['planner']:>8.3f} {med['rest']:>7.2f}"
        )


def prefill_logits(pipe: Pipeline, tokens: int, repeats: int) -> dict[str, float]:
    """ms: the runtime's prefill, the LM head's shapes in numpy, InferenceSession.run with every
    output fetched and with the logits not fetched."""
    session = pipe.target.fork()
    spec = session.spec
    if spec.attention != "gqa":
        raise SystemExit(f"the target graph is {spec.attention}; this measures a gqa graph")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, min(1000, spec.vocab_size), tokens)
    cache = session.new_cache(tokens + 8)

    def bound() -> None:
        cache.reset()
        session.forward(prompt, cache)

    hidden = rng.standard_normal((tokens, spec.hidden_size)).astype(np.float32)
    head = rng.standard_normal((spec.hidden_size, spec.vocab_size)).astype(np.float32)
    shape = (1, spec.kv_heads, tokens + 8, spec.head_dim)
    feed: dict[str, np.ndarray] = {
        contract.INPUT_IDS: prompt.reshape(1, tokens).astype(np.int64),
        contract.SEQLENS_K: np.array([tokens - 1], np.int32),
        contract.TOTAL_SEQUENCE_LENGTH: np.array(tokens, np.int32),
    }
    if contract.KEEP_LOGITS in {t.name for t in spec.inputs}:
        feed[contract.KEEP_LOGITS] = np.array(tokens, np.int64)  # every row's logits
    for layer in range(spec.num_layers):
        feed[contract.past_key(layer)] = np.zeros(shape, np.float32)
        feed[contract.past_value(layer)] = np.zeros(shape, np.float32)
    names = [o.name for o in session.session.get_outputs()]
    caches_only = [n for n in names if n != contract.LOGITS]
    out = {
        "prefill": median_ms(bound, repeats),
        "lm_head": median_ms(lambda: hidden @ head, repeats),
    }
    times: dict[str, list[float]] = {"every output fetched": [], "logits not fetched": []}
    for _ in range(repeats + 1):  # interleaved; the first round warms up
        for label, outputs in zip(times, (names, caches_only), strict=True):
            t0 = time.perf_counter()
            session.session.run(outputs, feed)
            times[label].append(1000 * (time.perf_counter() - t0))
    return out | {label: statistics.median(values[1:]) for label, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drafter", default="ngram+int8")
    parser.add_argument("--prefill-logits", action="store_true")
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    if args.prefill_logits:
        ms = prefill_logits(pipe, args.tokens, args.repeats)
        spec = pipe.target.spec
        print(
            f"a {args.tokens}-token prompt on the target's gqa graph; ms, median of {args.repeats}"
        )
        print(f"  the runtime's prefill (I/O binding, logits bound): {ms['prefill']:.1f}")
        print(
            f"  its LM head's shapes alone (numpy [{args.tokens}, {spec.hidden_size}] x "
            f"[{spec.hidden_size}, {spec.vocab_size}]): {ms['lm_head']:.1f}"
        )
        for label in ("every output fetched", "logits not fetched"):
            print(f"  InferenceSession.run, {label}: {ms[label]:.1f}")
        return
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]]
    parts = step_parts(pipe, prompts, args.concurrency, args.rounds, args.drafter)
    print(
        f"{args.concurrency} requests at a time, chat workload, 64 new tokens, {args.drafter}; "
        f"ms per batch step, median of {args.rounds} rounds"
    )
    print_parts(parts)


if __name__ == "__main__":
    main()

"""`specx bench --concurrency`: throughput and latency as concurrent requests share the target.

For each concurrency c and each mode (speculation off, each fixed K, -k auto) c requests start
together and run as one continuous batch (Pipeline.generate_batch on the batched graph), batch
after batch until every prompt ran (together_batches). Measured:
aggregate tokens/s (all tokens over the wall time), each request's latency (start to last token)
and time to first token. "alone" is one request at a time on the single-sequence graph
(Pipeline.generate), the way `specx run` serves it: the baseline every ratio is taken against.
Tokens/s are each repeat's whole workload (every prompt, all batches: tokens over wall time),
medians over repeats; latency and time to first token are medians over requests; all in one
process, interleaved so that drift hits every mode
alike: each unit of work (a prompt alone, or one concurrency's batches) runs in every mode back
to back, the modes' order turning by one each unit (work_units, mode_order).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from specx.runtime import Pipeline
from specx.runtime.settings import GenerationSettings

Progress = Callable[[str], None]


def concurrency_modes(drafter: str, ks: tuple[int, ...], auto: bool) -> list[dict[str, Any]]:
    modes: list[dict[str, Any]] = [{"name": "off", "k": 0, "drafter": "none"}]
    modes += [{"name": f"{drafter} K={k}", "k": k, "drafter": drafter} for k in ks]
    if auto:
        modes.append({"name": f"{drafter} K=auto", "k": "auto", "drafter": drafter})
    return modes


def _settings(mode: dict[str, Any], max_new: int, max_k: int) -> GenerationSettings:
    # cold: every mode runs the same prompts back to back (see runner._generate)
    return GenerationSettings(
        max_new_tokens=max_new, k=mode["k"], drafter=mode["drafter"], max_k=max_k, cache_scope=None
    )


def _alone(pipe: Pipeline, prompt: np.ndarray, settings: GenerationSettings) -> dict[str, float]:
    first: list[float] = []
    t0 = time.perf_counter()
    generation = pipe.stream(prompt, settings)
    for _ in generation:
        if not first:
            first.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    tokens = generation.result.stats.new_tokens
    return {"tokens": tokens, "wall_s": wall, "ttft_s": first[0] if first else wall}


def _together(
    pipe: Pipeline, prompts: list[np.ndarray], settings: GenerationSettings
) -> dict[str, Any]:
    n = len(prompts)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    t0 = time.perf_counter()

    def on_tokens(i: int, _tokens: np.ndarray) -> None:
        now = time.perf_counter() - t0
        first.setdefault(i, now)
        last[i] = now

    results = pipe.generate_batch(prompts, settings, max_batch=n, on_tokens=on_tokens)
    wall = time.perf_counter() - t0
    return {
        "tokens": sum(r.stats.new_tokens for r in results),
        "wall_s": wall,
        "latency_s": [last.get(i, wall) for i in range(n)],
        "ttft_s": [first.get(i, wall) for i in range(n)],
        "accepted_per_pass": [r.stats.tokens_per_pass for r in results],
    }


def run_concurrency(
    pipe: Pipeline,
    prompts: list[np.ndarray],
    concurrencies: tuple[int, ...],
    modes: list[dict[str, Any]],
    max_new: int,
    repeats: int,
    progress: Progress,
) -> dict[str, Any]:
    max_k = max([m["k"] for m in modes if isinstance(m["k"], int)] + [4])
    settings = {m["name"]: _settings(m, max_new, max_k) for m in modes}
    raw: dict[str, dict[str, list[Any]]] = {}
    total = repeats * len(modes) * (len(prompts) + len(concurrencies))
    done = 0
    for repeat in range(repeats):
        for u, (c, batches) in enumerate(work_units(len(prompts), concurrencies, repeat)):
            # every mode runs this unit of work back to back, so that the modes a ratio
            # compares ran within seconds of each other, not minutes apart
            for mode in mode_order(modes, repeat + u):
                cell = raw.setdefault(f"{mode['name']}|{c}", {"runs": []})
                for batch in batches:
                    if c == "alone":
                        run = _alone(pipe, prompts[batch[0]], settings[mode["name"]])
                    else:
                        run = _together(pipe, [prompts[i] for i in batch], settings[mode["name"]])
                    cell["runs"].append({**run, "repeat": repeat})
                done += 1
                progress(f"[{done}/{total}] repeat {repeat + 1} {c} {mode['name']}")
    return {
        "rows": _summarize(raw, modes, concurrencies),
        "max_new_tokens": max_new,
        "runs": {key: cell["runs"] for key, cell in raw.items()},  # every run, for a recount
    }


def work_units(
    n_prompts: int, concurrencies: tuple[int, ...], repeat: int
) -> list[tuple[int | str, list[list[int]]]]:
    """A repeat's work in the order it runs, as units (concurrency, batches of prompt indices)
    that every mode runs in turn: each prompt alone, then each concurrency's batches
    (together_batches)."""
    units: list[tuple[int | str, list[list[int]]]] = [("alone", [[i]]) for i in range(n_prompts)]
    units += [(c, together_batches(n_prompts, c, repeat)) for c in concurrencies]
    return units


def mode_order(modes: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The modes in the order a unit of work runs them: turned by one each unit, so that no
    mode always runs first or last (a shared machine's speed drifts, and a fixed order would
    charge the drift to the same modes every time)."""
    turn %= len(modes)
    return modes[turn:] + modes[:turn]


def together_batches(n_prompts: int, c: int, repeat: int) -> list[list[int]]:
    """The batches of c requests a repeat runs: as many as it takes for every prompt to be in
    one (the last batch wraps around), so that each concurrency is measured on every prompt, as
    "alone" is; the starting prompt turns with the repeat."""
    batches = -(-n_prompts // c)
    return [[(repeat + b * c + j) % n_prompts for j in range(c)] for b in range(batches)]


def _summarize(
    raw: dict[str, dict[str, list[Any]]], modes: list[dict[str, Any]], cs: tuple[int, ...]
) -> list[dict[str, Any]]:
    rows = []
    for mode in modes:
        alone = raw[f"{mode['name']}|alone"]["runs"]
        alone_tps = _workload_rate(alone)
        alone_latency = statistics.median(r["wall_s"] for r in alone)
        rows.append(
            {
                "mode": mode["name"],
                "concurrency": "alone",
                "tokens_per_s": alone_tps,
                "tokens_per_s_median_run": _median_run_rate(alone),
                "latency_s": alone_latency,
                "ttft_s": statistics.median(r["ttft_s"] for r in alone),
                "x_alone": 1.0,
                "latency_x_alone": 1.0,
            }
        )
        for c in cs:
            runs = raw[f"{mode['name']}|{c}"]["runs"]
            tps = _workload_rate(runs)
            latency = statistics.median(x for r in runs for x in r["latency_s"])
            rows.append(
                {
                    "mode": mode["name"],
                    "concurrency": c,
                    "tokens_per_s": tps,
                    "tokens_per_s_median_run": _median_run_rate(runs),
                    "latency_s": latency,
                    "ttft_s": statistics.median(x for r in runs for x in r["ttft_s"]),
                    "x_alone": tps / alone_tps,
                    "latency_x_alone": latency / alone_latency,
                    "tokens_per_pass": statistics.median(
                        x for r in runs for x in r["accepted_per_pass"]
                    ),
                }
            )
    best_alone = max(r["tokens_per_s"] for r in rows if r["concurrency"] == "alone")
    for r in rows:
        r["x_best_alone"] = r["tokens_per_s"] / best_alone
    _pair(raw, modes, rows)
    return rows


def _workload_rate(runs: list[dict[str, Any]]) -> float:
    """A cell's aggregate tokens/s: in each repeat, all its tokens over all its wall time (the
    whole workload at that concurrency: every prompt, every batch), the median over repeats.

    Not the median over its runs (single prompts alone, single batches together): those are of
    different prompts, and batches of different prompts differ in speed by more than the modes
    do (a batch whose rows stop early decodes its last row alone), so that median picks a kind
    of batch rather than summarizing the workload, and it can pick another kind for another
    mode (`tokens_per_s_median_run`, the bench's figure before it summarized whole workloads,
    kept for comparison; when that changed: docs/bench/measurements.md)."""
    return statistics.median(_by_repeat(runs).values())


def _median_run_rate(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["tokens"] / r["wall_s"] for r in runs)


def _by_repeat(runs: list[dict[str, Any]]) -> dict[int, float]:
    """A cell's tokens/s in each repeat: all its tokens over all its wall time in that repeat."""
    tokens: dict[int, float] = {}
    wall: dict[int, float] = {}
    for r in runs:
        tokens[r["repeat"]] = tokens.get(r["repeat"], 0.0) + r["tokens"]
        wall[r["repeat"]] = wall.get(r["repeat"], 0.0) + r["wall_s"]
    return {k: tokens[k] / wall[k] for k in tokens}


def _pair(
    raw: dict[str, dict[str, list[Any]]], modes: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> None:
    """Ratios taken within each repeat, medians over repeats (the medians of the cells above
    come from different minutes of a machine whose speed drifts; within a repeat every mode ran
    within a few minutes of the others): per row, its tokens/s over its mode's alone
    ("x_alone_paired"), and for -k auto over the fastest other mode at that concurrency in the
    same repeat ("x_better_paired": the maximum of noisy figures, so it leans against -k
    auto)."""
    speed = {key: _by_repeat(cell["runs"]) for key, cell in raw.items()}
    auto = [m["name"] for m in modes if m["k"] == "auto"]
    for r in rows:
        name, c = r["mode"], r["concurrency"]
        mine, alone = speed[f"{name}|{c}"], speed[f"{name}|alone"]
        r["x_alone_paired"] = statistics.median(mine[k] / alone[k] for k in mine)
        others = [speed[f"{m['name']}|{c}"] for m in modes if m["name"] != name]
        if name in auto and others:
            r["x_better_paired"] = statistics.median(
                mine[k] / max(o[k] for o in others) for k in mine
            )


def format_concurrency(results: dict[str, Any]) -> str:
    head = (
        f"{'mode':<18} {'requests':>8} {'tok/s':>8} {'x alone':>8} {'x best':>7} "
        f"{'latency s':>10} {'x alone':>8} {'TTFT s':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results["rows"]:
        lines.append(
            f"{r['mode']:<18} {r['concurrency']!s:>8} {r['tokens_per_s']:>8.1f} "
            f"{r['x_alone']:>8.2f} {r['x_best_alone']:>7.2f} {r['latency_s']:>10.2f} "
            f"{r['latency_x_alone']:>8.2f} {r['ttft_s']:>7.2f}"
        )
    lines.append(
        "alone: one request at a time on the single-sequence graph; N: N requests started "
        "together, one continuous batch. tok/s: in each repeat, all tokens over all the wall "
        "time (every prompt, every batch), the median over repeats; x best: against the fastest "
        "mode alone; latency and TTFT: medians over requests."
    )
    paired = [r for r in results["rows"] if "x_better_paired" in r]
    if paired:
        lines.append(
            f"{paired[0]['mode']} paired within each repeat (medians over repeats): x the "
            "fastest other mode "
            + ", ".join(f"{r['concurrency']} {r['x_better_paired']:.2f}" for r in paired)
            + "; x its own alone "
            + ", ".join(f"{r['concurrency']} {r['x_alone_paired']:.2f}" for r in paired[1:])
        )
    return "\n".join(lines)


def run_concurrency_bench(
    cfg: Any, concurrencies: tuple[int, ...], progress: Progress
) -> dict[str, Any]:
    """The concurrency benchmark for a BenchConfig: its first workload's prompts, its first
    drafter (or the artifact's default), its K values and -k auto."""
    from specx.apps.bench.runner import load_workloads, machine_info
    from specx.runtime.errors import InputError

    if any(not 1 <= c <= 64 for c in concurrencies) or not concurrencies:
        raise InputError(
            f"--concurrency takes request counts in 1..64, got {concurrencies}", "e.g. 1,2,4,8"
        )
    pipe = Pipeline.load(cfg.artifact, threads=cfg.threads)
    pipe.batched_session()  # fail now if the artifact has no batched graph
    workload = cfg.workloads[0]
    spec = load_workloads()[workload]
    chat = bool(spec.get("chat")) and pipe.manifest.chat_template is not None
    texts = spec["prompts"][: max(cfg.prompts_per_workload, max(concurrencies))]
    prompts = [pipe.codec.encode_chat(t) if chat else pipe.codec.encode(t) for t in texts]
    drafter = cfg.drafters[0] if cfg.drafters else pipe.default_drafter
    modes = concurrency_modes(drafter, cfg.ks, cfg.auto)
    results = run_concurrency(
        pipe, prompts, concurrencies, modes, cfg.max_new_tokens, cfg.repeats, progress
    )
    results.update(
        machine=machine_info(),
        artifact=str(cfg.artifact),
        workload=workload,
        prompts=len(prompts),
        repeats=cfg.repeats,
        drafter=drafter,
    )
    return results


def plot_concurrency(results: dict[str, Any], path: Any) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in dict.fromkeys(r["mode"] for r in results["rows"]):
        points = [
            (r["concurrency"], r["tokens_per_s"])
            for r in results["rows"]
            if r["mode"] == mode and r["concurrency"] != "alone"
        ]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("aggregate tokens/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

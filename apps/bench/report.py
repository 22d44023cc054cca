"""Turn `specx bench` results into a terminal table and a PNG plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def _f(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def best_config(per_config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = max(
        (n for n in per_config if n != "target"),
        key=lambda n: per_config[n]["decode_tokens_per_s"],
        default="target",
    )
    return name, per_config[name]


def adaptive_vs_fixed(per_config: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """Per drafter: K=auto's decode tokens/s over that of the drafter's best fixed K."""
    out: dict[str, tuple[float, str]] = {}
    for name, r in per_config.items():
        drafter, _, k = name.rpartition(" K=")
        if k != "auto":
            continue
        fixed = {
            n.rpartition(" K=")[2]: v["decode_tokens_per_s"]
            for n, v in per_config.items()
            if n.rpartition(" K=")[0] == drafter and n != name
        }
        if fixed:
            best_k = max(fixed, key=fixed.__getitem__)
            out[drafter] = (r["decode_tokens_per_s"] / fixed[best_k], best_k)
    return out


def adaptive_vs_fixed_held_out(records: list[dict[str, Any]], workload: str) -> dict[str, float]:
    """Per drafter: K=auto's decode tokens/s over the best fixed K's, in the same repeat, with the
    best K chosen on the *other* repeats; the median over repeats. The plain ratio of medians
    divides by the largest of several noisy medians, which is biased upward when fixed Ks are
    close; choosing on held-out repeats and pairing within a repeat removes the bias and the
    machine's drift between repeats."""
    rates: dict[str, dict[int, list[float]]] = {}  # config -> repeat -> [tokens, decode_s]
    for r in records:
        if r["workload"] == workload:
            acc = rates.setdefault(r["config"], {}).setdefault(r["repeat"], [0.0, 0.0])
            acc[0] += r["tokens"]
            acc[1] += r["decode_s"]
    tps = {c: {rep: t / s for rep, (t, s) in reps.items() if s} for c, reps in rates.items()}
    out: dict[str, float] = {}
    for name in tps:
        drafter, _, k = name.rpartition(" K=")
        fixed = [c for c in tps if c.rpartition(" K=")[0] == drafter and c != name]
        repeats = sorted(tps[name])
        if k != "auto" or not fixed or len(repeats) < 2:
            continue
        ratios = []
        for rep in repeats:
            others = [o for o in repeats if o != rep]
            best = max(fixed, key=lambda c: statistics.median(tps[c].get(o, 0.0) for o in others))
            if tps[best].get(rep):
                ratios.append(tps[name][rep] / tps[best][rep])
        if ratios:
            out[drafter] = statistics.median(ratios)
    return out


def format_report(results: dict[str, Any]) -> str:
    lines: list[str] = []
    m, costs = results["machine"], results["costs"]
    lines.append(
        f"machine: {m['cpu']}, {m['cores']} cores; onnxruntime "
        f"{m['versions'].get('onnxruntime')}; {m['date']}"
    )
    if "read_bandwidth_bytes_per_s" in costs:
        per_token = ", ".join(
            f"{name} {b / 1e6:.0f} MB ({1e3 * costs['floor_s'][name]:.1f} ms)"
            for name, b in costs["bytes_per_token"].items()
        )
        lines.append(
            f"memory bandwidth: read {costs['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, copy "
            f"(read+write) {costs['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; weight bytes read "
            f"per token (decode floor at that read bandwidth): {per_token}"
        )
    else:  # results written before reads were measured
        lines.append(
            f"memory bandwidth (copy, read+write) {costs['bandwidth_bytes_per_s'] / 1e9:.1f} "
            f"GB/s; target weights {costs['target_weight_bytes'] / 1e6:.0f} MB -> decode floor "
            f"{1e3 * costs['decode_floor_s']:.1f} ms"
        )
    steps = [
        per["target"]["verify_share"] / per["target"]["decode_tokens_per_s"]
        for per in results["greedy"].values()
        if "target" in per and per["target"]["decode_tokens_per_s"]
    ]
    if steps:
        step = sorted(steps)[len(steps) // 2]
        lines.append(
            f"target one-token step in the generation runs (median over workloads) "
            f"{1e3 * step:.1f} ms = {step / costs['decode_floor_s']:.2f}x floor"
        )
    ratios = ", ".join(f"K={k}: {v:.2f}" for k, v in costs["verify_ratio"].items() if k != "0")
    lines.append(
        f"micro-benchmark at 128 past: one-token step {1e3 * costs['target_pass_s']['1']:.1f} ms; "
        f"verify cost ratio (pass over K+1 tokens / 1 token) {ratios}"
    )
    if costs["c"]:
        lines.append(
            "micro-benchmark draft cost ratio c (draft pass / target pass): "
            + ", ".join(f"{d}: {c:.2f}" for d, c in costs["c"].items())
        )
    sweep = ", ".join(
        f"{ctx}: {1e3 * t:.1f} ms" for ctx, t in costs["decode_step_by_context_s"].items()
    )
    lines.append(f"decode step by context length: {sweep}")
    header = (
        f"{'config':<17}{'tok/s':>6}{'[min-max]':>13}{'speedup':>8}{'accept':>7}{'alpha':>6}"
        f"{'tok/pass':>9}{'c':>6}{'r':>6}{'pred':>6}{'meas/pred':>10}{'draft%':>7}{'verify%':>8}"
        f"{'other%':>7}"
    )
    for workload, per_config in results["greedy"].items():
        lines.append("")
        lines.append(
            f"== {workload} (greedy, median over repeats; speedup = decode tok/s vs "
            "target alone, same repeat; c, r = draft, verify pass / one-token target pass, "
            "measured in these runs)"
        )
        lines.append(header)
        for name, r in per_config.items():
            spread = f"[{r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f}]"
            lines.append(
                f"{name:<17}{r['tokens_per_s']:>6.1f}{spread:>13}{_f(r['speedup']):>8}"
                f"{100 * r['acceptance_rate']:>6.0f}%{r['alpha']:>6.2f}{r['tokens_per_pass']:>9.2f}"
                f"{_f(r.get('c')):>6}{_f(r.get('verify_ratio')):>6}"
                f"{_f(r.get('predicted_speedup')):>6}{_f(r.get('measured_over_predicted')):>10}"
                f"{100 * r['draft_share']:>6.1f}%{100 * r['verify_share']:>7.1f}%"
                f"{100 * r['overhead_share']:>6.1f}%"
            )
        name, best = best_config(per_config)
        lines.append(
            f"best: {name} at {best['decode_tokens_per_s']:.1f} decode tok/s, speedup "
            f"{_f(best['speedup'])}"
        )
        auto = adaptive_vs_fixed(per_config)
        held_out = adaptive_vs_fixed_held_out(results.get("greedy_records", []), workload)
        if auto:
            lines.append(
                "K=auto / best fixed K, decode tok/s (medians; in brackets: paired within each "
                "repeat, best K chosen on the other repeats): "
                + ", ".join(
                    f"{d} {ratio:.2f} (K={k})" + (f" [{held_out[d]:.2f}]" if d in held_out else "")
                    for d, (ratio, k) in auto.items()
                )
            )
    if "sampling" in results:
        lines.append("")
        lines.append(
            "== sampling (chat prompts; T=t: invariant verification, the default; "
            "T=t rejection: --verification rejection)"
        )
        for setting, per_config in results["sampling"].items():
            for name, r in per_config.items():
                lines.append(
                    f"T={setting:<15}{name:<14}{r['tokens_per_s']:>7.1f} tok/s  speedup "
                    f"{_f(r['speedup'])}  acceptance {100 * r['acceptance_rate']:.0f}%"
                )
    lines.append("")
    lines.append("== peers (same prompts, same number of new tokens)")
    lines.extend(_peer_lines(results))
    return "\n".join(lines)


def specx_overall(results: dict[str, Any], config: str) -> float | None:
    """Tokens/s of a configuration pooled over every workload (median over repeats)."""
    records = [r for r in results.get("greedy_records", []) if r["config"] == config]
    if not records:
        return None
    by_rep: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_rep.setdefault(r["repeat"], []).append(r)
    rates = sorted(
        sum(r["tokens"] for r in rs) / sum(r["total_s"] for r in rs) for rs in by_rep.values()
    )
    return rates[len(rates) // 2]


def _peer_lines(results: dict[str, Any]) -> list[str]:
    """Each peer against the specx configuration that does the same thing, pooled over every
    workload: generate vs the target alone, prompt lookup vs ngram, an int8/int4 assistant or
    draft vs specx's int8/int4 draft at the same K."""
    lines = []
    target = specx_overall(results, "target")
    configs = {r["config"] for r in results.get("greedy_records", [])} - {"target"}
    best_name = max(configs, key=lambda c: specx_overall(results, c) or 0.0, default=None)
    best = specx_overall(results, best_name) if best_name else None
    lines.append(
        f"specx target alone {_f(target, '.1f')} tok/s; specx best ({best_name}) "
        f"{_f(best, '.1f')} tok/s (all workloads pooled, prefill included)"
    )
    for peer, data in results.get("peers", {}).items():
        if "skipped" in data:
            lines.append(f"{peer}: skipped ({data['skipped']})")
            continue
        k = data.get("assisted_k", 3)
        for variant, r in data.items():
            if not isinstance(r, dict) or "tokens_per_s" not in r:
                if isinstance(r, dict) and "error" in r:
                    lines.append(f"{peer} {variant}: failed ({r['error']})")
                continue
            if variant in ("generate", "target"):
                ours = "target"
            elif variant == "prompt_lookup":
                ours = f"ngram K={k}"
            elif variant == "assisted_int8":
                ours = f"int8 K={k}"
            elif variant.startswith("int4 K="):
                ours = variant
            else:
                ours = best_name or "target"
            mine = specx_overall(results, ours)
            ratio = (
                f"specx {ours} {mine:.1f} tok/s, ratio {mine / r['tokens_per_s']:.2f}"
                if mine
                else ""
            )
            extra = ""
            if r.get("decode_tokens_per_s"):
                extra += f" (decode {r['decode_tokens_per_s']:.1f})"
            if r.get("acceptance") is not None:
                extra += f", acceptance {r['acceptance']:.2f}"
            lines.append(f"{peer} {variant:<16}{r['tokens_per_s']:>7.1f} tok/s{extra}   {ratio}")
        fastest = _peer_fastest(data)
        if fastest and best:
            lines.append(
                f"{peer} fastest ({fastest[0]}) {fastest[1]:.1f} tok/s; "
                f"specx fastest ({best_name}) / {peer} fastest = {best / fastest[1]:.2f}"
            )
    return lines


def _peer_fastest(data: dict[str, Any]) -> tuple[str, float] | None:
    """A peer's fastest mode (name, tokens/s), or None when no mode ran."""
    modes = [
        (name, float(r["tokens_per_s"]))
        for name, r in data.items()
        if isinstance(r, dict) and r.get("tokens_per_s")
    ]
    return max(modes, key=lambda m: m[1]) if modes else None


def _peer_ratios(results: dict[str, Any]) -> list[tuple[str, float]]:
    """(peer and mode, its tokens/s over specx's target alone), both pooled over every workload
    with prefill: the peers' lines in the plot."""
    target = specx_overall(results, "target")
    out = []
    for peer, data in results.get("peers", {}).items():
        for mode, r in data.items() if isinstance(data, dict) else ():
            if isinstance(r, dict) and r.get("tokens_per_s") and target:
                out.append((f"{peer} {mode}", float(r["tokens_per_s"]) / target))
    return out


def plot(results: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    workloads = list(results["greedy"])
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.2 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        per_config = results["greedy"][workload]
        drafters = sorted({n.partition(" K=")[0] for n in per_config if " K=" in n})
        for drafter in drafters:
            points = sorted(
                (int(n.partition(" K=")[2]), r)
                for n, r in per_config.items()
                if n.startswith(drafter + " K=") and n.partition(" K=")[2].isdigit()
            )
            ks = [k for k, _ in points]
            axes[row][0].plot(ks, [r["speedup"] for _, r in points], marker="o", label=drafter)
            axes[row][1].plot(
                ks, [r["acceptance_rate"] for _, r in points], marker="o", label=drafter
            )
            auto = per_config.get(f"{drafter} K=auto")
            if auto and auto["speedup"]:
                axes[row][0].axhline(
                    auto["speedup"],
                    linestyle=":",
                    linewidth=1,
                    color=axes[row][0].lines[-1].get_color(),
                )
        axes[row][0].axhline(1.0, color="grey", linewidth=1)
        for i, (label, ratio) in enumerate(_peer_ratios(results)):
            axes[row][0].axhline(ratio, linestyle="--", linewidth=1, label=label, color=f"C{i + 3}")
        axes[row][0].set_title(
            f"{workload}: vs target alone (dotted: K=auto; dashed: peers)", fontsize=9
        )
        axes[row][1].set_title(f"{workload}: acceptance rate")
        for ax in axes[row]:
            ax.set_xlabel("K")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"specx bench - {results['machine']['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

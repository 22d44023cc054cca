"""`specx bench`: where the speedup comes from, on one machine, in one process.

Measures, for the target alone and for every drafter and K: tokens/s (median and spread over
repeats, after a warm-up), acceptance, tokens per target pass, acceptance per draft position and
the time split (draft passes, target passes, everything else). Beside them: the cost ratio c of a
draft pass to a target pass, the verify cost ratio of a pass over K + 1 tokens, the speedup that
Leviathan et al. 2023 (Thm 3.8) predict from those and the measured acceptance, and the ratio
measured / predicted; the decode step time as the context grows; memory bandwidth and the
weights-read floor of a decode step. Runs are interleaved (repeat > prompt > configuration) so
that drifts of a noisy machine hit every configuration alike; speedups are ratios within a repeat.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specx.apps.bench.floor import bytes_per_token, memory_bandwidth, read_bandwidth
from specx.runtime import GenerationSettings, Pipeline, SamplingParams
from specx.runtime.backends import GraphSession
from specx.runtime.backends.providers import check_threads
from specx.runtime.drafters.registry import benchmark_drafters
from specx.runtime.errors import InputError
from specx.runtime.settings import MAX_K
from specx.runtime.verification.sampling import VERIFICATIONS

Progress = Callable[[str], None]


PEERS = ("hf", "genai", "llama.cpp")


@dataclass(frozen=True)
class BenchConfig:
    artifact: Path
    workloads: tuple[str, ...] = ("chat", "code", "grounded")
    drafters: tuple[str, ...] | None = None  # default: the registry's benchmark_drafters
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    auto: bool = True  # also run -k auto (max K = max(ks))
    max_new_tokens: int = 64
    prompts_per_workload: int = 3
    repeats: int = 3
    temperatures: tuple[float, ...] = (0.7, 1.0)  # sampling workload (chat prompts)
    sampling_k: int = 2
    verifications: tuple[str, ...] = VERIFICATIONS  # how sampled drafts are checked
    contexts: tuple[int, ...] = (64, 256, 1024, 2048)
    micro_repeats: int = 15
    peers: tuple[str, ...] = ("hf", "genai", "llama.cpp")
    hf_source: str | None = None  # default: the target's source in the manifest
    genai_python: str | None = None  # a python with onnxruntime-genai (separate venv)
    genai_models: str | None = None  # a pair from scripts/setup_genai.sh (default: found by source)
    llama_server: str | None = None  # llama.cpp's llama-server (scripts/setup_llamacpp.sh)
    threads: int | None = None

    def __post_init__(self) -> None:
        if not self.ks or not all(1 <= k <= MAX_K for k in self.ks):
            raise InputError(f"--k takes values in 1..{MAX_K}, got {list(self.ks)}")
        for name, value in (
            ("--prompts", self.prompts_per_workload),
            ("--repeats", self.repeats),
            ("-n", self.max_new_tokens),
        ):
            if value < 1:
                raise InputError(f"{name} must be >= 1, got {value}")
        if not all(math.isfinite(t) and t > 0 for t in self.temperatures):
            raise InputError(
                f"--temperatures must be finite and > 0, got {list(self.temperatures)}",
                "greedy decoding is always measured; '' skips sampling",
            )
        check_threads(self.threads)
        unknown = [p for p in self.peers if p not in PEERS]
        if unknown:
            raise InputError(
                f"--peers: unknown peer {unknown[0]!r}", f"choose from {', '.join(PEERS)}"
            )


def load_workloads(path: Path | None = None) -> dict[str, Any]:
    if path is None:
        text = (
            resources.files("specx.apps.bench").joinpath("data/workloads.json").read_text("utf-8")
        )
    else:
        text = path.read_text("utf-8")
    return dict(json.loads(text)["workloads"])


def machine_info() -> dict[str, Any]:
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
    }
    try:
        import importlib.metadata as md

        versions["specx"] = md.version("specx")
        versions["tokenizers"] = md.version("tokenizers")
    except Exception:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "providers": ort.get_available_providers(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def pass_times(
    session: GraphSession, widths: list[int], past: int, repeats: int
) -> dict[int, float]:
    """Median seconds of one pass over each width on top of `past` cached positions. The widths
    are interleaved within every repeat, so that a slow spell of the machine hits them alike."""
    cache = session.new_cache(past + max(widths) + 1)
    rng = np.random.default_rng(0)
    vocab = min(session.vocab_size, 1000)
    if session.spec.head is not None:
        features = np.zeros((past, session.spec.head.feature_size), np.float32)
        for start in range(0, past, session.max_chunk):
            chunk = slice(start, min(past, start + session.max_chunk))
            ids = rng.integers(10, vocab, size=chunk.stop - chunk.start).astype(np.int64)
            session.forward_head(ids, features[chunk], None, cache)
    else:
        session.prefill(rng.integers(10, vocab, size=past).astype(np.int64), cache)
    tokens = {w: rng.integers(10, vocab, size=w).astype(np.int64) for w in widths}
    times: dict[int, list[float]] = {w: [] for w in widths}
    head = session.spec.head is not None  # a feature draft: its chained pass reads its own state
    hidden = {w: np.zeros((w, session.spec.hidden_size), np.float32) for w in widths}

    def one_pass(w: int) -> None:
        if head:
            session.forward_head(tokens[w], None, hidden[w], cache)
        else:
            session.forward(tokens[w], cache)

    for w in widths:  # warm-up at every shape
        one_pass(w)
        cache.truncate(past)
    for _ in range(repeats):
        for w in widths:
            t0 = time.perf_counter()
            one_pass(w)
            times[w].append(time.perf_counter() - t0)
            cache.truncate(past)
    return {w: statistics.median(t) for w, t in times.items()}


def pass_time(session: GraphSession, width: int, past: int, repeats: int) -> float:
    return pass_times(session, [width], past, repeats)[width]


@dataclass
class RunRecord:
    workload: str
    config: str
    repeat: int
    prompt: int
    tokens: int
    total_s: float
    decode_s: float
    stats: dict[str, Any] = field(repr=False)
    target_passes: int = 0
    # the generated ids' digest: two runs (before and after a change, say) made the same tokens
    # iff their digests agree (scripts/diagnostics/same_tokens.py compares reports)
    token_digest: str = ""
    cached_tokens: int = 0  # prompt tokens kept from an earlier run: 0, runs are cold

    @staticmethod
    def of(workload: str, config: str, repeat: int, prompt: int, result: Any) -> RunRecord:
        stats = result.stats
        return RunRecord(
            workload,
            config,
            repeat,
            prompt,
            stats.new_tokens,
            stats.total_s,
            stats.decode_s,
            stats.to_json(),
            stats.target_passes,
            token_digest(result.token_ids),
            stats.reused_prompt_tokens,
        )


def token_digest(ids: list[int]) -> str:
    """A short digest of a token id sequence (sha256 of the ids as little-endian int64)."""
    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()[:16]


def _config_runs(pipe: Pipeline, cfg: BenchConfig, drafters: list[str]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = [{"name": "target", "k": 0, "drafter": "none"}]
    for d in drafters:
        runs += [{"name": f"{d} K={k}", "k": k, "drafter": d} for k in cfg.ks]
        if cfg.auto:
            runs.append({"name": f"{d} K=auto", "k": "auto", "drafter": d, "max_k": max(cfg.ks)})
    return runs


def _generate(
    pipe: Pipeline, prompt: np.ndarray, run: dict[str, Any], max_new: int, sampling: SamplingParams
) -> Any:
    # cold and independent: every configuration and repeat runs the same prompts, so a kept
    # prefix would make later runs' prompts free and a suffix history would draft from the
    # earlier runs' answers (conversations are `specx bench --sessions`' work)
    settings = GenerationSettings(
        max_new_tokens=max_new,
        k=run["k"],
        drafter=run["drafter"],
        max_k=run.get("max_k", 8),
        sampling=sampling,
        cache_scope=None,
    )
    return pipe.generate(prompt, settings)


def _aggregate(records: list[RunRecord], baseline: str = "target") -> dict[str, Any]:
    """Per configuration: median tokens/s over repeats, speedup vs baseline within a repeat."""
    by_config: dict[str, dict[int, list[RunRecord]]] = {}
    for r in records:
        by_config.setdefault(r.config, {}).setdefault(r.repeat, []).append(r)
    base = by_config.get(baseline, {})
    out: dict[str, Any] = {}
    for name, repeats in by_config.items():
        tps, dtps, speedups = [], [], []
        for rep, rs in repeats.items():
            tokens = sum(r.tokens for r in rs)
            tps.append(tokens / sum(r.total_s for r in rs))
            dtps.append(tokens / sum(r.decode_s for r in rs))
            if rep in base:
                b = base[rep]
                base_dtps = sum(r.tokens for r in b) / sum(r.decode_s for r in b)
                speedups.append(dtps[-1] / base_dtps)
        flat = [r.stats for rs in repeats.values() for r in rs]
        accepted = sum(s["accepted"] for s in flat)
        proposed = sum(s["proposed"] for s in flat)
        rejections = sum(s["rejections"] for s in flat)
        passes = sum(s["target_passes"] for s in flat)
        new = sum(s["new_tokens"] for s in flat)
        decode = sum(s["decode_s"] for s in flat)
        per_pos_a: list[int] = []
        per_pos_p: list[int] = []
        for s in flat:
            for i, (a, p) in enumerate(
                zip(s["accepted_per_position"], s["proposed_per_position"], strict=True)
            ):
                if i >= len(per_pos_p):
                    per_pos_a.append(0)
                    per_pos_p.append(0)
                per_pos_a[i] += a
                per_pos_p[i] += p
        out[name] = {
            "tokens_per_s": statistics.median(tps),
            "tokens_per_s_min": min(tps),
            "tokens_per_s_max": max(tps),
            "decode_tokens_per_s": statistics.median(dtps),
            "speedup": statistics.median(speedups) if speedups else None,
            "speedup_min": min(speedups) if speedups else None,
            "speedup_max": max(speedups) if speedups else None,
            "acceptance_rate": accepted / proposed if proposed else 0.0,
            "alpha": accepted / (accepted + rejections) if accepted + rejections else 0.0,
            "tokens_per_pass": new / passes if passes else 0.0,
            "mean_proposed_per_pass": proposed / passes if passes else 0.0,
            "acceptance_per_position": [
                a / p if p else 0.0 for a, p in zip(per_pos_a, per_pos_p, strict=True)
            ],
            "draft_share": sum(s["draft_s"] for s in flat) / decode if decode else 0.0,
            "verify_share": sum(s["verify_s"] for s in flat) / decode if decode else 0.0,
            "overhead_share": sum(s["overhead_s"] for s in flat) / decode if decode else 0.0,
            "draft_passes_per_pass": sum(s["draft_passes"] for s in flat) / passes
            if passes
            else 0.0,
            "mean_k": statistics.fmean(s["mean_k"] for s in flat) if flat else 0.0,
            "runs": len(flat),
        }
    return out


def run_bench(cfg: BenchConfig, progress: Progress) -> dict[str, Any]:
    pipe = Pipeline.load(cfg.artifact, threads=cfg.threads)
    workloads = load_workloads()
    unknown = [w for w in cfg.workloads if w not in workloads]
    if unknown:
        raise InputError(f"unknown workload(s) {unknown}", f"choose from {sorted(workloads)}")
    drafters = list(cfg.drafters) if cfg.drafters else benchmark_drafters(pipe.manifest)
    results: dict[str, Any] = {"machine": machine_info(), "config": _jsonable(asdict(cfg))}
    results["artifact"] = {
        "path": str(cfg.artifact),
        "pair_id": pipe.manifest.pair_id,
        "target": pipe.manifest.target.source,
    }

    # -- model-level costs ---------------------------------------------------------------
    progress("measuring memory bandwidth and pass costs")
    bandwidth = memory_bandwidth()
    reads = read_bandwidth()
    per_token = {"target": bytes_per_token(cfg.artifact, pipe.manifest.target)}
    for model in pipe.manifest.drafts:
        if model.name in drafters and model.graph != pipe.manifest.target.graph:
            per_token[model.name] = bytes_per_token(cfg.artifact, model)
    target = pipe.target
    widths = sorted({1, *(k + 1 for k in cfg.ks)})
    micro_past = max(0, min(128, pipe.manifest.max_length - max(widths) - 1))
    t_pass = pass_times(target, widths, micro_past, cfg.micro_repeats)
    weights = pipe.manifest.target.weight_bytes
    costs: dict[str, Any] = {
        "bandwidth_bytes_per_s": bandwidth,
        "target_weight_bytes": weights,
        "decode_floor_s": per_token["target"] / reads,
        "read_bandwidth_bytes_per_s": reads,
        "bytes_per_token": per_token,  # weight bytes a one-token pass reads, by model
        "floor_s": {name: b / reads for name, b in per_token.items()},
        "target_pass_s": {str(w): t for w, t in t_pass.items()},
        "verify_ratio": {str(w - 1): t_pass[w] / t_pass[1] for w in widths},
        "draft_pass_s": {},
        "c": {},
    }
    costs["target_step_vs_floor"] = t_pass[1] / costs["decode_floor_s"]
    for d in drafters:
        spec = next((s for s in pipe.manifest.drafts if s.name == d), None)
        if spec is None:
            continue  # ngram: no model pass
        session = pipe.draft_session(spec)
        t = pass_time(session, 1, micro_past, cfg.micro_repeats)
        costs["draft_pass_s"][d] = t
        costs["c"][d] = t / t_pass[1]
    progress("measuring decode step time against context length")
    sweep = {}
    for ctx in cfg.contexts:
        past = min(ctx, pipe.manifest.max_length - 2)
        sweep[str(past)] = pass_time(target, 1, past, max(5, cfg.micro_repeats // 2))
    costs["decode_step_by_context_s"] = sweep
    results["costs"] = costs

    # -- generation runs -----------------------------------------------------------------
    prompts: dict[str, list[np.ndarray]] = {}
    skipped: list[str] = []
    room = pipe.manifest.max_length - cfg.max_new_tokens
    for w in cfg.workloads:
        spec = workloads[w]
        chat = bool(spec.get("chat")) and pipe.manifest.chat_template is not None
        if spec.get("chat") and not chat:
            progress(f"{w}: the model has no chat template; its prompts go in as plain text")
        encoded = [
            pipe.codec.encode_chat(t) if chat else pipe.codec.encode(t) for t in spec["prompts"]
        ]
        fitting = [p for p in encoded if 0 < len(p) <= room][: cfg.prompts_per_workload]
        if fitting:
            prompts[w] = fitting
        else:
            skipped.append(w)
    if skipped:
        progress(f"skipped workload(s) {skipped}: prompts do not fit the context")
    if not prompts:
        raise InputError(
            "no workload prompt fits this artifact's context",
            "re-export with a larger --max-length or lower --max-new-tokens",
        )
    results["skipped_workloads"] = skipped
    runs = _config_runs(pipe, cfg, drafters)
    greedy = SamplingParams()
    first = next(iter(prompts.values()))[0]
    for run in runs:  # warm-up: every configuration once, not recorded
        _generate(pipe, first, run, 16, greedy)
    records: list[RunRecord] = []
    total = cfg.repeats * sum(len(p) for p in prompts.values()) * len(runs)
    done = 0
    for rep in range(cfg.repeats):
        for w, plist in prompts.items():
            for i, prompt in enumerate(plist):
                # a different configuration goes first each time: slow drifts of the machine
                # spread over all of them rather than always hitting the same neighbours
                shift = (rep * len(plist) + i) % len(runs)
                for run in runs[shift:] + runs[:shift]:
                    res = _generate(pipe, prompt, run, cfg.max_new_tokens, greedy)
                    records.append(RunRecord.of(w, run["name"], rep, i, res))
                    done += 1
                    bar = "#" * (24 * done // total) + "." * (24 - 24 * done // total)
                    progress(
                        f"[{bar}] {done}/{total} repeat {rep + 1} {w} prompt {i + 1} {run['name']}"
                    )
    results["greedy"] = {w: _aggregate([r for r in records if r.workload == w]) for w in prompts}
    results["greedy_records"] = [asdict(r) | {"stats": None} for r in records]
    add_predictions(results)

    # -- sampling workload -----------------------------------------------------------------
    if cfg.temperatures:
        results["sampling_records"] = []
        results["sampling"] = _sampling_runs(
            pipe, cfg, prompts, drafters, progress, results["sampling_records"]
        )

    # -- peers -----------------------------------------------------------------------------
    results["peers"] = _run_peers(pipe, cfg, prompts, drafters, progress)
    return results


def add_predictions(results: dict[str, Any]) -> None:
    """Leviathan et al.'s predicted speedup for every configuration, from costs measured inside
    the same runs (so that measured / predicted shows what the runtime itself loses):

    t1 = the target alone's time per step; per configuration, from its own steps: c = one draft
    pass / t1, r = one verify pass / t1, alpha = accepted / (accepted + rejections), and K' = the
    draft tokens proposed per step (K for a model draft; fewer for lookups that find no match).
    predicted = (1 - alpha^(K'+1)) / ((1 - alpha) (drafting per step / t1 + r)).
    """
    for per_config in results["greedy"].values():
        base = per_config.get("target")
        if not base or not base["decode_tokens_per_s"]:
            continue
        t1 = base["verify_share"] / base["decode_tokens_per_s"]  # one-token pass, in-loop
        for name, row in per_config.items():
            if name == "target" or not row["decode_tokens_per_s"] or not row["tokens_per_pass"]:
                continue
            step = row["tokens_per_pass"] / row["decode_tokens_per_s"]  # seconds per step
            passes = row["draft_passes_per_pass"]
            row["c"] = (row["draft_share"] * step / passes) / t1 if passes else 0.0
            row["verify_ratio"] = row["verify_share"] * step / t1
            drafting = row["draft_share"] * step / t1  # per step, in target passes
            k_eff = row["mean_proposed_per_pass"]
            alpha = min(row["alpha"], 1 - 1e-9)
            expected = (1 - alpha ** (k_eff + 1)) / (1 - alpha)
            row["predicted_speedup"] = expected / (drafting + row["verify_ratio"])
            if row["speedup"]:
                row["measured_over_predicted"] = row["speedup"] / row["predicted_speedup"]


def _sampling_runs(
    pipe: Pipeline,
    cfg: BenchConfig,
    prompts: dict[str, list[np.ndarray]],
    drafters: list[str],
    progress: Progress,
    kept: list[dict[str, Any]],
) -> dict[str, Any]:
    """Sampled runs per temperature and verification; their records are appended to `kept`."""
    workload = "chat" if "chat" in prompts else next(iter(prompts))
    out: dict[str, Any] = {}
    runs: list[dict[str, Any]] = [{"name": "target", "k": 0, "drafter": "none"}] + [
        {"name": f"{d} K={cfg.sampling_k}", "k": cfg.sampling_k, "drafter": d} for d in drafters
    ]
    settings = [("0.0", SamplingParams())] + [
        (f"{t}" if v == VERIFICATIONS[0] else f"{t} {v}", SamplingParams(t, verification=v))
        for t in cfg.temperatures
        for v in cfg.verifications
    ]
    for label, base in settings:
        records = []
        for rep in range(cfg.repeats):
            for i, prompt in enumerate(prompts[workload]):
                for run in runs:
                    params = dataclasses.replace(base, seed=1000 * rep + i)
                    res = _generate(pipe, prompt, run, cfg.max_new_tokens, params)
                    records.append(RunRecord.of(workload, run["name"], rep, i, res))
            progress(f"sampling T={label} repeat {rep + 1}/{cfg.repeats}")
        out[label] = _aggregate(records)
        kept += [asdict(r) | {"stats": None, "config": f"{r.config} T={label}"} for r in records]
    return out


def _run_peers(
    pipe: Pipeline,
    cfg: BenchConfig,
    prompts: dict[str, list[np.ndarray]],
    drafters: list[str],
    progress: Progress,
) -> dict[str, Any]:
    peers: dict[str, Any] = {}
    all_prompts = [p for plist in prompts.values() for p in plist]
    if "hf" in cfg.peers:
        try:
            from specx.apps.bench.hf_peer import hf_peer
        except ImportError as e:
            peers["hf"] = {"skipped": f"transformers/torch not installed ({e.name})"}
        else:
            progress("peer: Hugging Face transformers generate")
            peers["hf"] = hf_peer(
                cfg.hf_source or pipe.manifest.target.source,
                prompts,
                cfg.max_new_tokens,
                cfg.repeats,
                pipe.manifest,
                progress,
            )
    if "genai" in cfg.peers:
        from specx.apps.bench.genai_peer import genai_peer

        peers["genai"] = genai_peer(cfg, pipe.manifest.target.source, all_prompts, progress)
    if "llama.cpp" in cfg.peers:
        from specx.apps.bench.llamacpp_peer import llamacpp_peer

        target = pipe.manifest.target.source
        drafts = [
            d.source
            for d in pipe.manifest.drafts
            if d.source.endswith(".gguf") and d.source != target and d.head is None
        ]
        peers["llama.cpp"] = llamacpp_peer(
            cfg.llama_server,
            target,
            drafts[0] if drafts else None,
            all_prompts,
            cfg.max_new_tokens,
            cfg.repeats,
            cfg.threads or os.cpu_count(),
            progress,
        )
    return peers


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def stderr_progress(message: str) -> None:
    sys.stderr.write("\r\033[K" + message[:150])
    sys.stderr.flush()

"""`specx bench --sessions`: conversations turn by turn, as agents and chat clients send them.

Every turn sends the whole conversation so far (the system message, the earlier turns and the
model's own answers) through the chat template, as an agent does; the model's answer becomes
the next turn's history. Per turn: prompt tokens, cached tokens (the prompt positions the engine
kept from before instead of computing), the time to the first token, decode tokens/s and tokens
per target pass; per session: the total time. Each mode answers every session with its own
answers: specx with prompt reuse off (every prompt read whole), specx with reuse (the target
alone, and each drafter with -k auto), and llama-server on the artifact's own GGUF files with its
prompt cache on (its default), alone and with its speculative modes. specx's modes run
interleaved turn by turn, each in a cache scope of its own, each session starting with nothing
learned; llama-server's modes run one after the other, a server each. Greedy answers are checked
against specx's target alone with reuse off (exactness), llama.cpp's against its own target
alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from specx.apps.bench.session_costs import measure_costs, worst_priced
from specx.runtime import GenerationSettings, InputError, Pipeline
from specx.runtime.drafters.registry import NO_DRAFTER, benchmark_drafters
from specx.runtime.prefix import PrefixConfig

Progress = Callable[[str], None]
REFERENCE = "specx, reuse off"
LLAMA_REFERENCE = "llama.cpp"
LLAMA_SPEC_TYPES = ("ngram-mod", "ngram-simple")


@dataclass(frozen=True)
class Turn:
    """One turn of a session as a mode answered it."""

    turn: int
    prompt_tokens: int
    cached_tokens: int
    first_token_s: float
    new_tokens: int
    decode_s: float
    total_s: float
    target_passes: int
    answer_digest: str
    pass_widths: dict[str, int] = field(default_factory=dict)  # target passes by width (specx)
    draft_passes: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0


def load_sessions(path: Path | None = None) -> dict[str, Any]:
    if path is None:
        data = resources.files("specx.apps.bench").joinpath("data/conversations.json")
        text = data.read_text("utf-8")
    else:
        text = path.read_text("utf-8")
    return dict(json.loads(text)["sessions"])


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def specx_modes(pipe: Pipeline, drafters: tuple[str, ...] | None) -> list[dict[str, Any]]:
    """Reuse off and on for the target alone, then each drafter (default: the lookups, every
    draft model and suffix drafting in front of the first) with -k auto, reuse on."""
    modes: list[dict[str, Any]] = [
        {"name": REFERENCE, "drafter": NO_DRAFTER, "reuse": False},
        {"name": "specx", "drafter": NO_DRAFTER, "reuse": True},
    ]
    if drafters is None:
        models = [d for d in benchmark_drafters(pipe.manifest) if d not in ("ngram", "suffix")]
        drafters = ("ngram", "suffix", *models, *(f"suffix+{m}" for m in models[:1]))
    for d in drafters:
        if d not in pipe.drafter_names:
            raise InputError(f"unknown drafter {d!r}", f"choose from {pipe.drafter_names}")
        modes.append({"name": f"specx {d} K=auto", "drafter": d, "reuse": True})
    return modes


@dataclass
class Conversation:
    """One mode's conversation of one session: its messages so far, its turns and answers."""

    mode: dict[str, Any]
    settings: GenerationSettings
    messages: list[dict[str, str]]
    turns: list[Turn] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


def specx_turn(pipe: Pipeline, conv: Conversation, text: str) -> None:
    """The conversation's next turn through `pipe`: the whole conversation, then its answer."""
    conv.messages.append({"role": "user", "content": text})
    prompt = pipe.codec.encode_messages(conv.messages)
    t0 = time.perf_counter()
    result = pipe.generate(prompt, conv.settings)
    total = time.perf_counter() - t0
    s = result.stats
    turn = Turn(
        len(conv.turns) + 1,
        s.prompt_tokens,
        s.reused_prompt_tokens,
        s.first_token_s,
        s.new_tokens,
        s.decode_s,
        total,
        s.target_passes,
        digest(result.text),
        {str(w): n for w, n in sorted(s.pass_widths.items())},
        s.draft_passes,
    )
    conv.turns.append(turn)
    conv.answers.append(result.text)
    conv.messages.append({"role": "assistant", "content": result.text})


def run_specx_modes(
    artifact: Path,
    threads: int | None,
    sessions: dict[str, Any],
    drafters: tuple[str, ...] | None,
    max_k: int,
    progress: Progress,
) -> dict[str, Any]:
    """Every specx mode on every session, interleaved turn by turn (each turn's modes in an
    order turning by one), so that a noisy machine's drift hits every mode alike. Reuse off
    runs on a pipeline of its own; the others share one, each mode in a cache scope of its own,
    and each session starts with nothing learned."""
    pipes = {
        False: Pipeline.load(artifact, threads=threads, prefix=PrefixConfig(reuse=False)),
        True: Pipeline.load(artifact, threads=threads),
    }
    modes = specx_modes(pipes[True], drafters)
    out: dict[str, Any] = {mode["name"]: {} for mode in modes}
    for sname, session in sessions.items():
        for pipe in pipes.values():
            pipe.forget_policies()
        convs = []
        for mode in modes:
            settings = GenerationSettings(
                max_new_tokens=int(session["max_new_tokens"]),
                k=0 if mode["drafter"] == NO_DRAFTER else "auto",
                max_k=max_k,
                drafter=mode["drafter"],
                cache_scope=f"{mode['name']}/{sname}",
            )
            system = [{"role": "system", "content": session["system"]}]
            convs.append(Conversation(mode, settings, system))
        for i, text in enumerate(session["turns"]):
            shift = i % len(convs)
            for conv in convs[shift:] + convs[:shift]:
                progress(f"{sname} turn {i + 1}: {conv.mode['name']}")
                specx_turn(pipes[conv.mode["reuse"]], conv, text)
        for conv in convs:
            out[conv.mode["name"]][sname] = {
                "drafter": conv.mode["drafter"],
                "turns": [asdict(t) for t in conv.turns],
                "answers": conv.answers,
            }
    return out


def run_llama_session(
    base: str, pipe: Pipeline, session: dict[str, Any]
) -> tuple[list[Turn], list[str]]:
    """The session's turns through a running llama-server (prompt cache on): the same template
    and tokenizer render each prompt into the ids it gets."""
    from specx.apps.bench.llamacpp_peer import _post

    messages = [{"role": "system", "content": session["system"]}]
    turns, answers = [], []
    n = int(session["max_new_tokens"])
    for i, text in enumerate(session["turns"]):
        messages.append({"role": "user", "content": text})
        prompt = pipe.codec.encode_messages(messages).tolist()
        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "seed": 0}
        t0 = time.perf_counter()
        reply = _post(f"{base}/completion", body | {"cache_prompt": True})
        total = time.perf_counter() - t0
        timings = reply["timings"]
        predicted = int(timings["predicted_n"])
        decode_s = float(timings["predicted_ms"]) / 1000
        step_s = decode_s / predicted if predicted else 0.0
        passes = predicted - int(timings.get("draft_n_accepted", 0) or 0)
        answer = str(reply["content"])
        turns.append(
            Turn(
                i + 1,
                len(prompt),
                int(timings.get("cache_n", 0) or 0),
                float(timings["prompt_ms"]) / 1000 + step_s,  # its prompt, then a token
                predicted,
                decode_s,
                total,
                passes,
                digest(answer),
            )
        )
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer})
    return turns, answers


def llama_modes(draft_gguf: str | None) -> list[tuple[str, list[str]]]:
    modes: list[tuple[str, list[str]]] = [(LLAMA_REFERENCE, [])]
    modes += [(f"llama.cpp {t}", ["--spec-type", t]) for t in LLAMA_SPEC_TYPES]
    if draft_gguf:
        modes.append(("llama.cpp draft", ["-md", draft_gguf, "--spec-type", "draft-simple"]))
    return modes


def _llama_server(server: Path, args: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    from specx.apps.bench.llamacpp_peer import _free_port, _wait_ready

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [str(server), "--host", "127.0.0.1", "--port", str(port), "-np", "1", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(base, proc)
    except RuntimeError:
        proc.kill()
        raise
    return base, proc


def run_llama_modes(
    pipe: Pipeline,
    sessions: dict[str, Any],
    server_path: str | None,
    threads: int,
    progress: Progress,
) -> dict[str, Any]:
    """Every llama-server mode on every session: {mode: {session: {turns, answers}}}."""
    from specx.apps.bench.llamacpp_peer import find_server

    server = find_server(server_path)
    target = pipe.manifest.target.source
    if server is None:
        return {"skipped": "no llama-server (scripts/setup_llamacpp.sh, or SPECX_LLAMA_SERVER)"}
    if not target.endswith(".gguf") or not Path(target).is_file():
        return {"skipped": f"the target's source {target} is no GGUF file on this machine"}
    drafts = [
        d.source
        for d in pipe.manifest.drafts
        if d.source.endswith(".gguf") and d.source != target and Path(d.source).is_file()
    ]
    common = ["-m", target, "-c", str(pipe.manifest.max_length), "-ngl", "0"]
    common += ["-t", str(threads), "-tb", str(threads)]
    out: dict[str, Any] = {"server": str(server)}
    for name, extra in llama_modes(drafts[0] if drafts else None):
        if "-md" in extra:
            extra = [*extra, "-ngld", "0", "-td", str(threads), "-tbd", str(threads)]
        try:
            base, proc = _llama_server(server, common + extra)
        except (RuntimeError, OSError) as e:
            out[name] = {"error": str(e)[:200]}
            continue
        try:
            out[name] = {}
            for sname, session in sessions.items():
                progress(f"{name}: {sname}")
                turns, answers = run_llama_session(base, pipe, session)
                out[name][sname] = {"turns": [asdict(t) for t in turns], "answers": answers}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return out


def run_session_bench(
    artifact: Path,
    names: tuple[str, ...],
    drafters: tuple[str, ...] | None,
    peers: tuple[str, ...],
    llama_server: str | None,
    threads: int | None,
    max_k: int,
    progress: Progress,
    sessions_file: Path | None = None,
) -> dict[str, Any]:
    """Every mode on every session named (from data/conversations.json, or `sessions_file`)."""
    from specx.apps.bench.runner import machine_info

    available = load_sessions(sessions_file)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise InputError(f"unknown session(s) {unknown}", f"choose from {sorted(available)}")
    sessions = {n: available[n] for n in names}
    results: dict[str, Any] = {
        "machine": machine_info(),
        "artifact": str(artifact),
        "sessions": {
            n: {"max_new_tokens": s["max_new_tokens"], "turns": len(s["turns"])}
            for n, s in sessions.items()
        },
    }
    results["modes"] = run_specx_modes(artifact, threads, sessions, drafters, max_k, progress)
    priced = Pipeline.load(artifact, threads=threads)
    results["costs"] = measure_costs(priced, results["modes"], progress)
    if "llama.cpp" in peers:
        codec = Pipeline.load(artifact, threads=threads)  # the same template and tokenizer
        results["llama.cpp"] = run_llama_modes(
            codec, sessions, llama_server, threads or os.cpu_count() or 1, progress
        )
    return results


# -- the report ------------------------------------------------------------------------------
def session_rows(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per session, one row per mode (specx's, then llama.cpp's)."""
    modes = dict(results["modes"])
    peer = results.get("llama.cpp", {})
    modes.update({k: v for k, v in peer.items() if isinstance(v, dict) and "error" not in v})
    rows: dict[str, list[dict[str, Any]]] = {}
    for sname in results["sessions"]:
        for name, per_session in modes.items():
            if sname not in per_session:
                continue
            reference = LLAMA_REFERENCE if name.startswith("llama.cpp") else REFERENCE
            ref = modes.get(reference, {}).get(sname)
            row = _row(name, per_session[sname], ref)
            cost = results.get("costs", {}).get(sname)
            auto = "K=auto" in name and name.startswith("specx")
            row["priced_worst"] = worst_priced(per_session[sname], cost) if cost and auto else None
            rows.setdefault(sname, []).append(row)
    return rows


def worst_turn(row: dict[str, Any], alone: dict[str, Any] | None) -> float | None:
    """The lowest of a mode's per-turn decode rates over the target alone's with reuse (the
    same answers turn for turn, so the same tokens): what '-k auto never loses' is held to."""
    if alone is None or "K=auto" not in row["mode"] or not row["mode"].startswith("specx"):
        return None
    ratios = [
        a / b
        for a, b in zip(
            row["turn_decode_tokens_per_s"], alone["turn_decode_tokens_per_s"], strict=False
        )
        if b > 0
    ]
    return min(ratios) if ratios else None


def _row(name: str, run: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    turns = [Turn(**t) for t in run["turns"]]
    tokens = sum(t.new_tokens for t in turns)
    decode = sum(t.decode_s for t in turns)
    passes = sum(t.target_passes for t in turns)
    same = None
    if reference is not None:
        theirs = [t["answer_digest"] for t in reference["turns"]]
        same = sum(a.answer_digest == b for a, b in zip(turns, theirs, strict=False))
    return {
        "mode": name,
        "first_token_s": [t.first_token_s for t in turns],
        "cached": [t.cached_tokens for t in turns],
        "prompt": [t.prompt_tokens for t in turns],
        "decode_tokens_per_s": tokens / decode if decode else 0.0,
        "turn_decode_tokens_per_s": [t.decode_tokens_per_s for t in turns],
        "tokens_per_pass": tokens / passes if passes else 0.0,
        "session_s": sum(t.total_s for t in turns),
        "same_turns": same,
        "turns": len(turns),
    }


def format_sessions(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"specx bench --sessions: {results['artifact']}",
        f"{m['date']}  {m['cpu']} ({m['cores']} cores)",
        "greedy; every turn sends the whole conversation; TTFT: time to the first token; cached:",
        "prompt tokens kept from before; tok/s: the session's new tokens over its decode time;",
        "worst: the lowest turn's decode rate over specx's target alone (reuse on), that turn;",
        "priced: the same with each turn's passes priced (target passes by width, draft passes)",
        "at costs measured once in this run, free of the machine's drift between turns;",
        "same: turns whose answer equals the reference's (specx: reuse off, target alone;",
        "llama.cpp: its target alone)",
    ]
    for sname, rows in session_rows(results).items():
        info = results["sessions"][sname]
        turns, most = info["turns"], info["max_new_tokens"]
        lines += ["", f"{sname}: {turns} turns, up to {most} new tokens each"]
        lines.append(
            f"{'mode':<30} {'TTFT per turn (s)':<26} {'cached per turn':<22} "
            f"{'tok/s':>6} {'worst':>5} {'priced':>6} {'tok/pass':>8} {'session s':>9} "
            f"{'same':>5}"
        )
        base = next((r for r in rows if r["mode"] == REFERENCE), None)
        alone = next((r for r in rows if r["mode"] == "specx"), None)
        for r in rows:
            ttft = " ".join(f"{x:.1f}" for x in r["first_token_s"])
            cached = " ".join(str(c) for c in r["cached"])
            same = "-" if r["same_turns"] is None else f"{r['same_turns']}/{r['turns']}"
            worst = worst_turn(r, alone)
            low = "" if worst is None else f"{worst:.2f}"
            priced = "" if r["priced_worst"] is None else f"{r['priced_worst']:.2f}"
            lines.append(
                f"{r['mode']:<30} {ttft:<26} {cached:<22} {r['decode_tokens_per_s']:>6.1f} "
                f"{low:>5} {priced:>6} {r['tokens_per_pass']:>8.2f} {r['session_s']:>9.1f} "
                f"{same:>5}"
            )
        if base is not None:
            fastest = min(
                (r for r in rows if r["mode"].startswith("llama.cpp")),
                key=lambda r: r["session_s"],
                default=None,
            )
            specx = [r for r in rows if r["mode"].startswith("specx")]
            best = min(specx, key=lambda r: r["session_s"])
            ratio = best["session_s"] / base["session_s"]
            line = f"best specx: {best['mode']}, {ratio:.2f}x reuse off"
            if fastest is not None:
                line += f", {best['session_s'] / fastest['session_s']:.2f}x {fastest['mode']}"
            lines.append(line)
    return "\n".join(lines)

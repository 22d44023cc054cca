"""How often prompt reuse parts a conversation's tokens from a cold start's, on an artifact's own
kernels: every session of specx bench's conversations (data/conversations.json) run turn by turn
twice, with prompt reuse and without, greedy; each turn's prompt is the cold run's conversation
so far, so that both runs read the same prompt. On the specx kernels a kept position holds a
prompt pass's bits and no turn may part; on ONNX Runtime's kernels a position computed in a
verify pass may differ in its last bits, and a turn parts where the target's two best logits lie
that close. Prints per drafter: turns, turns parted, and at each parting the top-2 logit gap of
the cold target there.

    .venv/bin/python scripts/diagnostics/prefix_parity.py ARTIFACT [--drafters none,suffix]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from specx.apps.bench.sessions import load_sessions
from specx.runtime import GenerationSettings, Pipeline
from specx.runtime.prefix import PrefixConfig


def top_gap(pipe: Pipeline, ids: list[int]) -> float:
    """The target's top-2 logit gap after `ids`, read cold in prompt passes."""
    target = pipe.target.fork()
    cache = target.new_cache(len(ids) + 1)
    target.prefill(np.asarray(ids[:-1], np.int64), cache)
    row = np.sort(target.forward(np.asarray(ids[-1:], np.int64), cache)[-1])
    return float(row[-1] - row[-2])


def compare(
    warm: Pipeline, cold: Pipeline, sessions: dict[str, Any], drafter: str, max_new: int | None
) -> dict[str, Any]:
    k: Any = 0 if drafter == "none" else "auto"
    turns = parted = 0
    gaps: list[float] = []
    for name, session in sessions.items():
        n = max_new or int(session["max_new_tokens"])
        settings = GenerationSettings(
            max_new_tokens=n, k=k, drafter=drafter, max_k=16, cache_scope=f"{drafter}/{name}"
        )
        messages = [{"role": "system", "content": session["system"]}]
        for text in session["turns"]:
            messages.append({"role": "user", "content": text})
            ids = warm.codec.encode_messages(messages)
            if len(ids) + n > warm.manifest.max_length:
                break
            got = warm.generate(ids, settings).token_ids
            want = cold.generate(ids, settings)
            turns += 1
            if got != want.token_ids:
                parted += 1
                pairs = enumerate(zip(got, want.token_ids, strict=False))
                at = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want.token_ids)))
                gaps.append(top_gap(cold, ids.tolist() + want.token_ids[:at]))
            messages.append({"role": "assistant", "content": want.text})
    return {"turns": turns, "parted": parted, "gaps_at_parting": gaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--drafters", default="none,suffix")
    parser.add_argument("--sessions", default=None, help="Comma list (default: all).")
    parser.add_argument("-n", "--max-new-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    available = load_sessions()
    names = args.sessions.split(",") if args.sessions else list(available)
    sessions = {n: available[n] for n in names}
    warm = Pipeline.load(args.artifact, threads=args.threads)
    cold = Pipeline.load(args.artifact, threads=args.threads, prefix=PrefixConfig(reuse=False))
    report = {
        d: compare(warm, cold, sessions, d, args.max_new_tokens) for d in args.drafters.split(",")
    }
    print(json.dumps({"artifact": str(args.artifact), "drafters": report}, indent=1))


if __name__ == "__main__":
    main()

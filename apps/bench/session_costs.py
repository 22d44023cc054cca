"""A session turn's decode priced by its passes: the target's passes counted by width and the
draft model's passes, each at a cost measured once in the same run. A turn's ratio to the
target alone then depends on what the policy chose (how wide, how often), not on what else the
machine did during those seconds; a turn of 100 tokens moves 5-10 % between two runs of the
same work, which a per-turn bound of a few percent cannot be judged on."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection
from typing import Any

from specx.runtime import Pipeline
from specx.runtime.drafters.registry import NO_DRAFTER

REPEATS = 5  # passes a width, interleaved (runner.pass_times)


def model_draft(drafter: str, models: Collection[str]) -> str | None:
    """The draft model among `models` a mode's drafter runs (`suffix+draft` -> `draft`)."""
    last = drafter.rsplit("+", 1)[-1]
    return last if drafter != NO_DRAFTER and last in models else None


def measure_costs(
    pipe: Pipeline, modes: dict[str, Any], progress: Callable[[str], None]
) -> dict[str, Any]:
    """Per session: the target's pass time at every width the modes used and each used draft
    model's one-token pass, at the session's mean prompt length (the context its decode ran at)."""
    from specx.apps.bench.runner import pass_times

    costs: dict[str, Any] = {}
    sessions = sorted({s for per_session in modes.values() for s in per_session})
    for sname in sessions:
        runs = [per[sname] for per in modes.values() if sname in per]
        turns = [t for run in runs for t in run["turns"]]
        widths = sorted({1} | {int(w) for t in turns for w in t.get("pass_widths", {})})
        past = int(statistics.mean(t["prompt_tokens"] for t in turns))
        past = max(1, min(past, pipe.manifest.max_length - widths[-1] - 1))
        progress(f"{sname}: pass costs at {past} cached positions, widths 1..{widths[-1]}")
        target = pass_times(pipe.target, widths, past, REPEATS)
        drafts: dict[str, float] = {}
        models = {d.name for d in pipe.manifest.drafts if d.head is None}
        for run in runs:
            name = model_draft(run.get("drafter", NO_DRAFTER), models)
            if name is not None and name not in drafts:
                session = pipe.draft_session(pipe.manifest.find_draft(name))
                drafts[name] = pass_times(session, [1], past, REPEATS)[1]
        costs[sname] = {
            "past": past,
            "target_s": {str(w): t for w, t in target.items()},
            "draft_s": drafts,
        }
    return costs


def priced_ratio(turn: dict[str, Any], cost: dict[str, Any], draft: str | None) -> float | None:
    """The turn's new tokens at the target alone's one-token cost over what its passes cost:
    its target passes at their widths' costs and its draft passes at the draft's one-token cost
    (a catch-up pass over several tokens counts as one: optimistic where a lazy draft reads a
    long prompt inside the decode)."""
    widths = turn.get("pass_widths") or {}
    target = cost["target_s"]
    if not widths or any(w not in target for w in widths):
        return None
    spent = sum(n * target[w] for w, n in widths.items())
    if draft is not None:
        spent += turn.get("draft_passes", 0) * cost["draft_s"].get(draft, 0.0)
    return turn["new_tokens"] * target["1"] / spent if spent > 0 else None


def worst_priced(run: dict[str, Any], cost: dict[str, Any]) -> float | None:
    """The lowest priced ratio over a mode's turns (None where a turn cannot be priced)."""
    draft = model_draft(str(run.get("drafter", NO_DRAFTER)), cost["draft_s"])
    ratios = [priced_ratio(t, cost, draft) for t in run["turns"]]
    known = [r for r in ratios if r is not None]
    return min(known) if known and len(known) == len(ratios) else None

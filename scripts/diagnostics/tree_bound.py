"""What tree drafting could give a feature head on this machine: measured parts, and a bound.

    python scripts/diagnostics/tree_bound.py model.gguf HEAD ARTIFACT
        [--workloads chat,code,grounded] [--depth 6] [--past 100] [--repeats 15]

Issue 17 asks for tree drafting (several candidates per position, verified in one pass under a
tree attention mask) "where it pays more, measured". This measures what it could pay here before
anyone builds it:

1. offline (as head_acceptance.py): the target answers each workload's prompts greedily;
   the head unrolls `--depth` steps along the target's own tokens from every position and records
   the rank of the target's token among its draft logits at each step (true_token_ranks). Under
   greedy verification a draft tree accepts the longest prefix of the target's path that it holds.
   A static tree (SpecInfer, Medusa, Sequoia: nodes named by rank paths like (0, 1)) therefore
   accepts, summed over the starts, the counts of its nodes' rank paths; the best static tree of N
   nodes holds the N most frequent paths (a child is never more frequent than its parent, so they
   form a tree). No independence between depths is assumed.
   Any tree whose siblings are taken in the head's order (a static tree, EAGLE-2's dynamic tree:
   a node's confidence falls with its rank) holds the target's path to depth d only with at least
   sum over j <= d of (rank_j + 1) nodes: the upper bound counts, per start, the depths whose path
   fits in N nodes that way.
2. timed first (the artifact's own graphs; nothing else may run meanwhile): the target's gqa
   graph over 1 + N tokens after `--past` cached positions (a causal pass does the work a
   tree-masked pass over as many tokens does), and the head's graph over W tokens; medians of
   `--repeats`.
3. speedup over the target alone, per node budget N: (1 + accepted) x t_target(1) /
   (t_target(1 + N) + drafting). The best static tree drafts one head pass per depth, over the
   nodes of the depth before that have children (the first over the committed pair: width 1);
   the bound charges each depth the cheapest head pass measured, and takes the best depth.
   Both leave out a step's host work (verification, bookkeeping, a tree's cache compaction), so
   they overstate what a built tree would run at. K chained drafts are the static tree (0),
   (0, 0), ...: their rows show by how much, next to what `specx bench` measures for the chain.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
from head_acceptance import measure  # scripts/ (this script's folder) is on sys.path

from specx.apps.bench.timing import median_ms

NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 63)  # a pass takes at most 64 tokens

Path_ = tuple[int, ...]


def path_counts(ranks: np.ndarray) -> Counter[Path_]:
    """For every rank path (r_1 .. r_d): the starts whose target path begins with it. ranks:
    [starts, depth] (-1 past the answer's end, a huge rank outside the draft vocabulary)."""
    counts: Counter[Path_] = Counter()
    for row in ranks.tolist():
        path: list[int] = []
        for r in row:
            if r < 0 or r >= 1 << 20:
                break
            path.append(r)
            counts[tuple(path)] += 1
    return counts


def best_tree(counts: Counter[Path_], nodes: int) -> list[Path_]:
    """The static tree of at most `nodes` nodes that accepts the most: the most frequent paths
    (at equal counts the shorter, so that a parent always comes before its child)."""
    order = sorted(counts, key=lambda p: (-counts[p], len(p), p))
    return order[:nodes]


def tree_accepted(counts: Counter[Path_], tree: list[Path_], starts: int) -> float:
    """Expected draft tokens a step accepts with this tree: each node counts for every start
    whose target path runs through it."""
    return sum(counts[p] for p in tree) / max(1, starts)


def expanded_per_depth(tree: list[Path_]) -> list[int]:
    """Per depth d = 0 .. depth - 1: the nodes at d that have children in the tree (depth 0: the
    committed token, one pass over it), the width of the head's pass that drafts depth d + 1."""
    depth = max((len(p) for p in tree), default=0)
    parents = {p[:-1] for p in tree}
    return [sum(1 for p in parents if len(p) == d) for d in range(depth)]


def bound_accepted(ranks: np.ndarray, nodes: int, depth: int) -> float:
    """Upper bound on the expected accepted draft tokens of any tree of `nodes` nodes and
    `depth` depths whose siblings follow the head's ranking: depth d counts for a start if its
    path to d fits, sum over j <= d of (rank_j + 1) <= nodes."""
    valid = (ranks >= 0) & (ranks < 1 << 20)  # [starts, depth]
    need = np.cumsum(np.where(valid, ranks + 1, nodes + 1), axis=1)
    reach = np.cumprod(valid, axis=1).astype(bool) & (need <= nodes)
    return float(reach[:, :depth].sum() / max(1, ranks.shape[0]))


def pass_costs(
    artifact: str, past: int, repeats: int, depth: int
) -> tuple[dict[int, float], dict[int, float]]:
    """ms of a target pass over W tokens and of a head pass over W tokens, after `past`."""
    from specx.runtime import Pipeline

    pipe = Pipeline.load(artifact)
    target = pipe.target.fork()
    head_name = next(d.name for d in pipe.manifest.drafts if d.head is not None)
    head = pipe.new_drafter(head_name).session
    rng = np.random.default_rng(0)
    hidden_size = head.spec.hidden_size
    t_cache, h_cache = target.new_cache(past + 80), head.new_cache(past + 80)
    t_cache.advance(past)
    h_cache.advance(past)

    def on_target(width: int) -> None:
        t_cache.truncate(past)
        target.forward(rng.integers(0, 1000, width), t_cache)

    def on_head(width: int) -> None:
        h_cache.truncate(past)
        hidden = np.zeros((width, hidden_size), np.float32)
        head.forward_head(rng.integers(0, 1000, width), None, hidden, h_cache)

    widths = sorted({*range(1, depth + 2), *(n + 1 for n in NODES)})
    target_ms = {w: median_ms(lambda w=w: on_target(w), repeats) for w in widths}
    head_ms = {w: median_ms(lambda w=w: on_head(w), repeats) for w in range(1, 65)}
    return target_ms, head_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target")
    parser.add_argument("head", type=Path)
    parser.add_argument("artifact")
    parser.add_argument("--workloads", default="chat,code,grounded")
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--past", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    # timed first: torch's threads (the offline part) slow the passes timed after them
    target_ms, head_ms = pass_costs(args.artifact, args.past, args.repeats, args.depth)
    ranks: dict[str, np.ndarray] = {}
    workloads = [w for w in args.workloads.split(",") if w]
    measure(args.target, args.head, workloads, args.max_new_tokens, args.depth, False, print, ranks)
    print(f"passes after {args.past} positions, ms (median of {args.repeats}):")
    print("  target " + ", ".join(f"{w}: {t:.1f}" for w, t in target_ms.items()))
    print("  head   " + ", ".join(f"{w}: {t:.2f}" for w, t in head_ms.items() if w in target_ms))
    cheapest_head = min(head_ms.values())
    for name in workloads:
        r = ranks[name]
        counts = path_counts(r)
        starts = r.shape[0]
        top = [float(np.mean((r[:, 0] >= 0) & (r[:, 0] < k))) for k in (1, 2, 4, 8, 16)]
        print(
            f"\n{name}: {starts} starts; first position in the head's top 1/2/4/8/16: "
            + " / ".join(f"{x:.2f}" for x in top)
        )
        print("  nodes  static: accepted  x target alone (tree widths)   bound: accepted  x alone")
        for k in range(1, args.depth + 1):
            chain = [(0,) * d for d in range(1, k + 1)]
            acc = tree_accepted(counts, chain, starts)
            cost = target_ms[k + 1] + sum(head_ms[w] for w in expanded_per_depth(chain))
            print(f"  chain K={k}: accepted {acc:.2f}, {(1 + acc) * target_ms[1] / cost:.2f}x")
        for n in NODES:
            tree = best_tree(counts, n)
            acc = tree_accepted(counts, tree, starts)
            per_depth = expanded_per_depth(tree)
            cost = target_ms[n + 1] + sum(head_ms[w] for w in per_depth)
            static_x = (1 + acc) * target_ms[1] / cost
            bound = [
                (
                    (1 + bound_accepted(r, n, d))
                    * target_ms[1]
                    / (target_ms[n + 1] + d * cheapest_head),
                    bound_accepted(r, n, d),
                )
                for d in range(1, min(n, args.depth) + 1)
            ]
            bound_x, bound_acc = max(bound)
            print(
                f"  {n:5d}  {acc:15.2f}  {static_x:14.2f}  {per_depth!s:>16}"
                f"  {bound_acc:15.2f}  {bound_x:7.2f}"
            )


if __name__ == "__main__":
    main()

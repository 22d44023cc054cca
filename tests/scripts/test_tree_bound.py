"""scripts/diagnostics/tree_bound.py: the best static draft tree and the bound on any tree,
against brute force over every tree of a few nodes."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specx.exporter.heads.distill.train import OUTSIDE, chain_acceptance, tokens_per_pass

SCRIPTS = Path(__file__).parents[2] / "scripts" / "diagnostics"


@pytest.fixture(scope="module")
def tree_bound() -> Any:
    sys.path.insert(0, str(SCRIPTS))  # the script imports head_acceptance from its folder
    try:
        spec = importlib.util.spec_from_file_location("tree_bound", SCRIPTS / "tree_bound.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))


def _ranks(seed: int, starts: int = 40, depth: int = 3, ends: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = rng.geometric(0.5, (starts, depth)) - 1  # mostly 0 and 1, now and then more
    ranks[rng.random((starts, depth)) < 0.05] = OUTSIDE
    if ends:  # some answers end within the depth: -1 past the end
        last = rng.integers(1, depth + 1, starts)
        ranks[np.arange(depth)[None] >= last[:, None]] = -1
    return ranks


def _accepted_by_brute_force(ranks: np.ndarray, tree: set[tuple[int, ...]]) -> float:
    total = 0
    for row in ranks.tolist():
        d = 0
        while d < len(row) and 0 <= row[d] < OUTSIDE and tuple(row[: d + 1]) in tree:
            d += 1
        total += d
    return total / ranks.shape[0]


def _trees(nodes: int, depth: int, width: int) -> list[set[tuple[int, ...]]]:
    """Every tree of at most `nodes` nodes over rank paths with ranks < width."""
    candidates = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    out = []
    for n in range(1, nodes + 1):
        for chosen in itertools.combinations(candidates, n):
            tree = set(chosen)
            if all(len(p) == 1 or p[:-1] in tree for p in tree):
                out.append(tree)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_best_static_tree_accepts_as_much_as_the_best_of_every_tree_of_its_size(
    tree_bound: Any, seed: int
) -> None:
    ranks = _ranks(seed, depth=2)
    counts = tree_bound.path_counts(ranks)
    for nodes in range(1, 5):
        best = tree_bound.best_tree(counts, nodes)
        assert all(len(p) == 1 or p[:-1] in best for p in best)  # it is a tree
        got = tree_bound.tree_accepted(counts, best, ranks.shape[0])
        assert got == pytest.approx(_accepted_by_brute_force(ranks, set(best)))
        brute = max(_accepted_by_brute_force(ranks, t) for t in _trees(nodes, 2, 3))
        assert got == pytest.approx(brute)
        # no tree whose siblings follow the ranking beats the bound, at any depth it allows
        assert tree_bound.bound_accepted(ranks, nodes, 2) >= brute - 1e-12


@pytest.mark.parametrize("seed", [3, 4])
def test_a_chain_is_the_tree_of_top_ranked_nodes_and_accepts_what_chain_acceptance_predicts(
    tree_bound: Any, seed: int
) -> None:
    # (with answers ending inside the depth, chain_acceptance's conditional shares leave the
    # ended starts out of the later positions: the same only up to that)
    ranks = _ranks(seed, starts=200, depth=4, ends=False)
    counts = tree_bound.path_counts(ranks)
    for k in range(1, 5):
        chain = [(0,) * d for d in range(1, k + 1)]
        got = tree_bound.tree_accepted(counts, chain, ranks.shape[0])
        assert got == pytest.approx(tokens_per_pass(chain_acceptance(ranks), k) - 1.0)
        assert tree_bound.expanded_per_depth(chain) == [1] * k
        # a chain of k nodes is one of the trees the bound covers
        assert tree_bound.bound_accepted(ranks, k, k) >= got - 1e-12


def test_the_bound_grows_with_nodes_and_depth_and_never_counts_past_an_answers_end(
    tree_bound: Any,
) -> None:
    ranks = np.array([[0, 0, 0], [1, 0, -1], [OUTSIDE, -1, -1], [0, 2, 0]])
    assert tree_bound.bound_accepted(ranks, 1, 3) == pytest.approx(2 / 4)  # (0) only
    assert tree_bound.bound_accepted(ranks, 3, 3) == pytest.approx((3 + 2 + 1) / 4)
    assert tree_bound.bound_accepted(ranks, 3, 1) == pytest.approx(3 / 4)
    assert tree_bound.bound_accepted(ranks, 100, 3) == pytest.approx((3 + 2 + 0 + 3) / 4)

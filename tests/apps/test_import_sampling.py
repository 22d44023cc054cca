"""Speculative sampling on an imported pair (Optimum's graphs, the real exporter) follows the
imported target's own distribution: the exact law of the first two tokens, computed from the
target graph's logits, against samples from the target alone and from the pair (chi-square);
the same test catches a verifier that accepts every draft token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optimum_models import needs_optimum

from specx.apps.importer import ImportOptions, import_pair
from specx.runtime import Pipeline, SamplingParams
from specx.runtime.verification.sampling import warp
from stats_tools import STOP, accept_everything_invariant, chi_square_p_value, sampled_first_two

pytestmark = needs_optimum
ALPHA = 1e-3
SAMPLES = 1500
PROMPT = np.array([5, 9, 12, 4, 7], dtype=np.int64)
PARAMS = SamplingParams(temperature=0.8, top_k=6, top_p=0.95)


@pytest.fixture(scope="module")
def pair(optimum_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sampling") / "pair"
    draft = [str(optimum_folders["draft"])]
    import_pair(optimum_folders["target"], draft, out, ImportOptions(), lambda _: None)
    return out


def exact_first_two(pipe: Pipeline, params: SamplingParams, eos: int) -> dict[Any, float]:
    """{(first, second or STOP): p} from the imported target graph's own logits."""
    session = pipe.target
    cache = session.new_cache(len(PROMPT) + 4)
    p1 = warp(session.forward(PROMPT, cache)[-1].copy(), params)  # [vocab]
    joint: dict[Any, float] = {}
    for a in np.flatnonzero(p1 > 0):
        if a == eos:
            joint[(int(a), STOP)] = float(p1[a])
            continue
        cache.truncate(len(PROMPT))
        p2 = warp(session.forward(np.array([a], dtype=np.int64), cache)[-1].copy(), params)
        for b in np.flatnonzero(p2 > 0):
            joint[(int(a), int(b))] = float(p1[a] * p2[b])
    return joint


def sampled_pairs(pipe: Pipeline, k: int | str, eos: int) -> list[Any]:
    return sampled_first_two(pipe, PROMPT, PARAMS, k, eos, SAMPLES)


@pytest.mark.parametrize("k", [0, 4, "auto"])
def test_the_first_two_tokens_follow_the_imported_targets_distribution(
    pair: Path, k: int | str
) -> None:
    pipe = Pipeline.load(pair)
    eos = pipe.manifest.special_tokens.eos_token_ids[0]
    expected = exact_first_two(pipe, PARAMS, eos)
    assert sum(1 for p in expected.values() if p * SAMPLES >= 5) >= 8  # a meaningful test
    assert chi_square_p_value(sampled_pairs(pipe, k, eos), expected) > ALPHA


def test_the_same_test_catches_a_verifier_that_accepts_every_draft_token(
    pair: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specx.runtime.verification.verifier as verifier

    monkeypatch.setattr(verifier, "verify_invariant", accept_everything_invariant)
    pipe = Pipeline.load(pair)
    eos = pipe.manifest.special_tokens.eos_token_ids[0]
    expected = exact_first_two(pipe, PARAMS, eos)
    assert chi_square_p_value(sampled_pairs(pipe, 4, eos), expected) < 1e-6

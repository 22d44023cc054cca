"""scripts/diagnostics/adaptive_sim.py: -k auto's policy replayed on a recorded trace with
measured pass costs."""

from __future__ import annotations

import numpy as np

from conftest import load_script
from specx.runtime.decode.adaptive import AdaptiveK


def test_the_replay_simulation_runs_the_real_policy_on_a_recorded_trace() -> None:
    sim = load_script("adaptive_sim")
    # an easy text (8 of 8 accepted, confident) followed by a hard one (nothing accepted, unsure)
    trace = {
        "accepted": [8] * 30 + [0] * 30,
        "confidence": [[0.99] * 8] * 30 + [[0.2] * 8] * 30,
    }
    costs = {"target": {w: 0.020 + 0.001 * w for w in range(1, 8)}, "draft": {1: 0.01, 2: 0.011}}
    rng = np.random.default_rng(0)
    rates = {}
    for k in (1, 4):
        tokens, seconds = sim.replay(trace, costs, None, k, rng)
        assert tokens == 60 and seconds > 0
        rates[k] = tokens / seconds
    policy = AdaptiveK(max_k=6)
    tokens, seconds = sim.replay(trace, costs, policy, 0, rng)
    assert tokens == 60 and policy.history
    assert tokens / seconds > max(rates.values())  # long where easy, nothing wasted where hard

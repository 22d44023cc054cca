"""scripts/diagnostics/concurrency_goals.py: issue 16's goals read from a concurrency bench
run."""

from __future__ import annotations

import numpy as np

from conftest import load_script


def test_the_goal_script_reads_issue_16s_figures_from_a_concurrency_run() -> None:
    script = load_script("concurrency_goals")

    def run(auto_at_4: float, fixed_alone: float) -> dict:
        speeds = {
            "off": {"alone": 60.0, 1: 60.0, 2: 110.0, 4: 190.0, 8: 300.0},
            "ngram K=2": {"alone": fixed_alone, 1: 70.0, 2: 95.0, 4: 130.0, 8: 170.0},
            "ngram K=auto": {"alone": 72.0, 1: 70.0, 2: 108.0, 4: auto_at_4, 8: 290.0},
        }
        rows = [
            {"mode": m, "concurrency": c, "tokens_per_s": t, "latency_x_alone": 1.5}
            for m, by_c in speeds.items()
            for c, t in by_c.items()
        ]
        return {"rows": rows, "machine": {"date": "today"}}

    met = script.goals(run(auto_at_4=185.0, fixed_alone=70.0))
    assert np.isclose(met["aggregate_at_4"], 185.0 / 72.0)
    assert np.isclose(met["auto_share"]["4"], 185.0 / 190.0)
    assert met["met"] == (True, True, True)
    # the same bar for every mode: the fixed K alone against the faster of off and -k auto
    assert np.isclose(met["every_mode_share"]["ngram K=2"]["alone"], 70.0 / 72.0)
    assert met["every_mode_share"]["ngram K=auto"] == met["auto_share"]
    # slower at 4 than 2.5x alone, and alone below 0.95 of the fixed K: two goals missed
    missed = script.goals(run(auto_at_4=175.0, fixed_alone=80.0))
    assert missed["met"] == (False, True, False)

"""scripts/diagnostics/lookup_by_match.py: the lookup's offers counted by the length of their
match."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).parents[2] / "scripts" / "diagnostics" / "lookup_by_match.py"


def test_each_offer_is_counted_under_its_match_length_with_the_run_verification_would_accept() -> (
    None
):
    spec = importlib.util.spec_from_file_location("lookup_by_match", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    context = np.array([1, 2, 3, 4, 1, 2, 3, 5], dtype=np.int64)
    # from position 4: "4" never occurred before (no offer); "1" did (offers 2 3 4 ..., two
    # right); "1 2" did (offers 3 4 ..., one right); "1 2 3" did (offers 4 ..., none right)
    assert script.offers_by_match(context, 4, ()) == [(1, 2), (2, 1), (3, 0)]
    # an offer stops after an EOS token (8 here): "7" offers 8 alone, "7 8" offers 9 7 8
    assert script.offers_by_match(np.array([7, 8, 9, 7, 8, 9], dtype=np.int64), 3, (8,)) == [
        (1, 1),
        (2, 1),
    ]

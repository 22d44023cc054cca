"""The reference every greedy test compares with: transformers' own greedy `generate`, and the
one difference an exact implementation may show, a floating-point near-tie.

A verify pass over K + 1 tokens multiplies other matrix shapes than a one-token pass, so two exact
implementations may still part at a near-tie of the target's two best logits; where outputs
differ, `assert_same_or_near_tie` demands that the first difference is such a tie (gap below
TIE_MARGIN) and fails otherwise.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

CONSUMER = Path(__file__).resolve().parents[1] / "reference" / "consumer.py"

TIE_MARGIN = 1e-4  # largest top-2 logit gap counted as a floating-point near-tie


def hf_greedy(
    model: Any, prompt: np.ndarray, max_new_tokens: int, eos: tuple[int, ...]
) -> list[int]:
    import copy

    import torch

    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = list(eos) or [2**31 - 1]  # no EOS: an id that never occurs
    config.pad_token_id = eos[0] if eos else 0
    config.do_sample = False
    config.max_new_tokens = max_new_tokens
    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(prompt)[None],
            attention_mask=torch.ones(1, prompt.shape[0], dtype=torch.long),
            generation_config=config,
        )
    return out[0, prompt.shape[0] :].tolist()


def assert_same_or_near_tie(
    model: Any, prompt: np.ndarray, got: list[int], want: list[int]
) -> None:
    import torch

    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert first is not None, f"one output is a prefix of the other: {got} vs {want}"
    prefix = np.concatenate([prompt, np.asarray(want[:first], dtype=np.int64)])
    with torch.no_grad():
        logits = model(torch.from_numpy(prefix)[None]).logits[0, -1]
    top2 = torch.topk(logits, 2).values
    gap = float(top2[0] - top2[1])
    assert gap < TIE_MARGIN, (
        f"outputs differ at new token {first} ({got[first]} vs {want[first]}) and the target's "
        f"top-2 gap there is {gap:.2e}, not a near-tie"
    )


def reference_consumer() -> ModuleType:
    """reference/consumer.py (the artifact format's executable companion), loaded as a module."""
    spec = importlib.util.spec_from_file_location("reference_consumer", CONSUMER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

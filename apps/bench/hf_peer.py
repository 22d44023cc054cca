"""Hugging Face transformers as a benchmark peer (used by `specx bench`, never by the runtime).

On the same source model and the same prompt token ids: plain greedy ``generate``; assisted
generation with prompt lookup (the peer of specx's n-gram drafter); and assisted generation with
an int8 dynamically quantized copy of the target (torch's quantize_dynamic on every Linear: the
peer of specx's int8 draft), or with a draft model given by path.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from specx.exporter.weights.load import load_source
from specx.runtime.artifact.contract import Manifest


def _timed_generate(
    model: Any, prompt: np.ndarray, max_new: int, **kwargs: Any
) -> tuple[int, float]:
    import torch

    ids = torch.from_numpy(prompt)[None]
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            **kwargs,
        )
        elapsed = time.perf_counter() - t0
    return int(out.shape[1] - ids.shape[1]), elapsed


def hf_peer(
    source: str,
    prompts: dict[str, list[np.ndarray]],
    max_new: int,
    repeats: int,
    manifest: Manifest,
    progress: Callable[[str], None],
    assisted_k: int = 3,
    draft_source: str | None = None,
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    src = load_source(source, lambda _m: None)
    model = src.model
    eos = list(manifest.special_tokens.eos_token_ids)
    pad = eos[0] if eos else None
    common = {"eos_token_id": eos, "pad_token_id": pad}
    variants: dict[str, dict[str, Any]] = {
        "generate": {},
        "prompt_lookup": {"prompt_lookup_num_tokens": assisted_k},
    }
    if draft_source:
        assistant = load_source(draft_source, lambda _m: None).model
        variants["assisted_draft"] = {"assistant_model": assistant}
    else:
        assistant = torch.ao.quantization.quantize_dynamic(
            load_source(source, lambda _m: None).model, {torch.nn.Linear}, dtype=torch.qint8
        )
        variants["assisted_int8"] = {"assistant_model": assistant}
    for kwargs in variants.values():
        if "assistant_model" in kwargs:
            kwargs.update(num_assistant_tokens=assisted_k, num_assistant_tokens_schedule="constant")
    flat = [p for plist in prompts.values() for p in plist]
    out: dict[str, Any] = {"source": source, "assisted_k": assisted_k}
    for name, kwargs in variants.items():
        _timed_generate(model, flat[0], 8, **common, **kwargs)  # warm-up
        per_repeat = []
        for rep in range(repeats):
            tokens = seconds = 0.0
            for prompt in flat:
                n, dt = _timed_generate(model, prompt, max_new, **common, **kwargs)
                tokens += n
                seconds += dt
            per_repeat.append(tokens / seconds)
            progress(f"peer hf {name}: repeat {rep + 1}/{repeats}")
        out[name] = {
            "tokens_per_s": statistics.median(per_repeat),
            "tokens_per_s_min": min(per_repeat),
            "tokens_per_s_max": max(per_repeat),
        }
    return out

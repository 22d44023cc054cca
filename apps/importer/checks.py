"""What `specx import` checks before it writes anything: the pair shares one tokenizer, and a
graph's pass over K + 1 tokens gives the logits of K + 1 one-token passes at the same positions
(recorded in the manifest as its parity, like an export's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.errors import InputError

CHECK_TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nThe quick brown fox jumps over the lazy dog."
)


def load_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception subclasses from Rust
        raise InputError(
            f"cannot read the tokenizer {path}: {str(e)[:200]}",
            "copy the model's tokenizer.json (a fast tokenizer) beside its graph",
        ) from e


def same_tokenizer(target: Path, draft: Path) -> None:
    """Refuse a draft whose tokenizer maps a token to another id than the target's, naming the
    first such id."""
    t_vocab = load_tokenizer(target).get_vocab(with_added_tokens=True)
    d_vocab = load_tokenizer(draft).get_vocab(with_added_tokens=True)
    if t_vocab == d_vocab:
        return
    t_by_id = {i: s for s, i in t_vocab.items()}
    d_by_id = {i: s for s, i in d_vocab.items()}
    first = min(i for i in set(t_by_id) | set(d_by_id) if t_by_id.get(i) != d_by_id.get(i))
    raise InputError(
        f"the tokenizers of {target.parent} and {draft.parent} differ: token id {first} is "
        f"{t_by_id.get(first)!r} in the target and {d_by_id.get(first)!r} in the draft",
        "a draft must share the target's tokenizer; pick a draft of the same family",
    )


def multi_token_parity(
    graph_path: Path, spec: ModelSpec, ids: np.ndarray, k: int
) -> dict[str, Any]:
    """A pass over K + 1 tokens against K + 1 one-token passes at the same positions, after a
    prompt of `ids`: max |dlogit| and how often the argmax agrees; then the same K + 1 tokens
    again after a rollback over them (the rolled-back slots must change nothing)."""
    from specx.runtime.backends.ort_session import OrtSession

    session = OrtSession(graph_path, spec)
    prompt, tail = ids[: -(k + 1)], ids[-(k + 1) :]
    cache = session.new_cache(min(spec.max_length, len(ids) + 2 * (k + 1)))
    session.prefill(prompt, cache)
    start = cache.length
    wide = session.forward(tail, cache).copy()  # [k + 1, vocab]
    cache.truncate(start)
    single = np.stack([session.forward(tail[i : i + 1], cache)[0].copy() for i in range(k + 1)])
    cache.truncate(start)
    again = session.forward(tail, cache).copy()
    diff = float(np.abs(wide - single).max())
    agree = float(np.mean(wide.argmax(-1) == single.argmax(-1)))
    return {
        "kind": "import",
        "check_k": k,
        "max_abs_logit_diff": diff,
        "argmax_agreement": agree,
        "after_rollback_max_abs_logit_diff": float(np.abs(again - wide).max()),
    }


def rewrite_parity(
    original: Path, spec: ModelSpec, rewritten: Path, new_spec: ModelSpec, ids: np.ndarray
) -> dict[str, Any]:
    """A rewritten graph against its original: the logits of a prompt's pass and of four decode
    steps after it (the original's greedy tokens, fed to both); refused where they part beyond
    float rounding."""
    a, tokens = _pass_logits(original, spec, ids, None)
    b, _ = _pass_logits(rewritten, new_spec, ids, tokens)
    diff = float(np.abs(a - b).max())
    agree = float(np.mean(a.argmax(-1) == b.argmax(-1)))
    tolerance = 1e-3 * max(1.0, float(np.abs(a).max()))
    if not diff <= tolerance or agree < 1.0:
        raise InputError(
            f"{rewritten.name}: the rewritten graph parts from {original}: max|dlogit| {diff:.2e} "
            f"(tolerance {tolerance:.1e}), argmax agrees {100 * agree:.1f}%",
            "import it without --rewrite (it runs as exported)",
        )
    return {"max_abs_logit_diff": diff, "argmax_agreement": agree, "tolerance": tolerance}


def _pass_logits(
    graph: Path, spec: ModelSpec, ids: np.ndarray, tokens: list[int] | None
) -> tuple[np.ndarray, list[int]]:
    """Logits [len(ids) + 4, vocab] of a prompt's pass and four one-token steps fed `tokens`
    (None: the graph's own greedy choices), and the tokens fed."""
    from specx.runtime.backends.ort_session import OrtSession

    session = OrtSession(graph, spec)
    cache = session.new_cache(min(spec.max_length, len(ids) + 8))
    rows = [session.forward(ids, cache).copy()]  # [len(ids), vocab]
    fed: list[int] = []
    for step in range(4):
        token = int(rows[-1][-1].argmax()) if tokens is None else tokens[step]
        fed.append(token)
        rows.append(session.forward(np.array([token], dtype=np.int64), cache).copy())
    return np.concatenate(rows), fed

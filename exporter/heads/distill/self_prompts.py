"""Self-written prompts for `specx distill`: the target writes its users' requests itself.

An instruct model fed only the opening of a user turn in its own chat template (the system
prompt where the template has one, then the user header) goes on with what a user would ask:
the Magpie method (Xu et al., 2024). Sampled at temperature 1, every continuation is one
request, as varied as the model's own picture of its users: advice, plans, stories, code,
opinions, follow-ups. The shipped templates ask a dozen question shapes over many topics; a head
trained only on their answers learns those shapes (held-out acceptance on them is far above
what it reaches on other chat), and these requests bring the shapes templates miss without
putting any particular prompt set into the data. The target then answers them greedily like
every other prompt, so the training data stays the target's own output.

Kept: continuations that end with the end of the turn (not cut by the token limit), of at least
three words, each request once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specx.exporter.heads.distill.data import Prompt
from specx.exporter.weights.load import Log, SourceModel

MARK = "\x00specx-user-turn\x00"
MAX_REQUEST_TOKENS = 64  # a request longer than this is dropped (cut mid-sentence)
OVERSAMPLE = 1.4  # continuations sampled per request wanted (some are dropped)


def user_turn_prefix(src: SourceModel) -> list[int] | None:
    """Token ids of the chat template up to where a user's message starts (None: the target has
    no chat template, or its template does not render a user message as given)."""
    tok = src.tokenizer
    if not getattr(tok, "chat_template", None):
        return None
    text = tok.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False)
    if not isinstance(text, str) or MARK not in text:
        return None
    prefix = text[: text.index(MARK)]
    return [int(i) for i in tok(prefix, add_special_tokens=False)["input_ids"]]


def keep_requests(texts: list[str], want: int) -> list[str]:
    """The usable requests among decoded whole continuations, in order, each once (case and
    spacing aside), at least three words, at most `want`."""
    seen: set[str] = set()
    kept: list[str] = []
    for text in texts:
        request = text.strip()
        key = " ".join(request.lower().split())
        if len(key.split()) < 3 or key in seen:
            continue
        seen.add(key)
        kept.append(request)
        if len(kept) == want:
            break
    return kept


def _sample_transformers(
    src: SourceModel,
    prefix: list[int],
    n: int,
    eos: tuple[int, ...],
    batch: int,
    seed: int,
    on_done: Callable[[int], None] = lambda _n: None,
) -> list[list[int]]:
    import torch

    device = next(src.model.parameters()).device
    torch.manual_seed(seed)
    pad = int(eos[0]) if eos else 0
    ids = torch.tensor([prefix], dtype=torch.long, device=device)
    out: list[list[int]] = []
    for start in range(0, n, batch):
        rows = min(batch, n - start)
        with torch.no_grad():
            generated = src.model.generate(
                input_ids=ids.expand(rows, -1),
                attention_mask=torch.ones((rows, len(prefix)), dtype=torch.long, device=device),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=MAX_REQUEST_TOKENS,
                pad_token_id=pad,
                eos_token_id=list(eos) or None,
            )
        for row in generated[:, len(prefix) :].tolist():
            ended = [j for j, t in enumerate(row) if t in eos]
            out.append(row[: ended[0] + 1] if ended else row)
        on_done(rows)
    return out


def self_written_prompts(
    src: SourceModel,
    n: int,
    eos: tuple[int, ...],
    generator: Any,
    batch: int,
    seed: int,
    log: Log,
    progress: Any = None,
) -> list[Prompt]:
    """Up to n chat prompts the target writes itself (see the module); [] without a chat
    template. `generator`: the runtime route (its `sample`) or None for transformers."""
    prefix = user_turn_prefix(src)
    if prefix is None or n <= 0:
        if n > 0:
            log("  the target has no chat template: no self-written prompts")
        return []
    stops = set(eos)
    sampled = int(n * OVERSAMPLE) + 1
    bar = progress(total=sampled, desc="requests", unit="request") if progress else None
    on_done = bar.update if bar is not None else (lambda _n: None)
    try:
        if generator is not None:
            rows = generator.sample(prefix, sampled, MAX_REQUEST_TOKENS, eos, seed, on_done)
        else:
            rows = _sample_transformers(src, prefix, sampled, eos, batch, seed, on_done)
    finally:
        if bar is not None:
            bar.close()
    texts = [
        src.tokenizer.decode(row, skip_special_tokens=True)
        for row in rows
        if row and row[-1] in stops  # ended its turn: a whole request
    ]
    kept = keep_requests(texts, n)
    log(
        f"  the target wrote {len(kept)} requests of its own ({len(rows)} sampled, "
        f"{len(texts)} ended their turn)"
    )
    return [Prompt(text, True, "self-written") for text in kept]

"""What a generation gives back: its text, tokens, stats and logprobs (`GenerationResult`), and
the iterator of text deltas a stream returns (`Generation`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specx.runtime.decode.stats import Stats
from specx.runtime.verification.logprobs import TokenLogprob


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    stats: Stats
    finished: bool = True  # False when the consumer stopped early (e.g. Ctrl-C)
    # one per token of token_ids when the generation asked for logprobs (logprobs.py)
    logprobs: list[TokenLogprob] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_tokens": len(self.prompt_token_ids),
            "finished": self.finished,
            "stats": self.stats.to_json(),
        }
        if self.logprobs is not None:
            out["logprobs"] = [
                {"token": t.token, "logprob": t.logprob, "top": [list(a) for a in t.top]}
                for t in self.logprobs
            ]
        return out


@dataclass
class Generation:
    """An iterator of text deltas; ``result`` is complete once iteration ends (or stops)."""

    _iterator: Iterator[str]
    result: GenerationResult

    def __iter__(self) -> Iterator[str]:
        return self._iterator

    def __next__(self) -> str:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()  # type: ignore[attr-defined]

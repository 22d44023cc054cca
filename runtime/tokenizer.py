"""Tokenizer (the `tokenizers` library), chat template (jinja2), incremental detokenization."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from specx.runtime.artifact.contract import SpecialTokens
from specx.runtime.errors import ArtifactError, InputError

REPLACEMENT_CHAR = "\ufffd"


class TextCodec:
    """Encodes prompts (plain or through the chat template) and decodes token ids."""

    def __init__(
        self, tokenizer_path: Path, special: SpecialTokens, chat_template: str | None
    ) -> None:
        if not tokenizer_path.is_file():
            raise ArtifactError(
                f"tokenizer file {tokenizer_path} is missing", "re-export the artifact"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise ArtifactError(
                f"{tokenizer_path} is not a valid tokenizer: {e}", "re-export the artifact"
            ) from e
        self.special = special
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return np.asarray(ids, dtype=np.int64)

    @property
    def special_ids(self) -> set[int]:
        """Ids of the special tokens (decoding leaves them out of the text)."""
        added = self.tokenizer.get_added_tokens_decoder()
        return {int(i) for i, token in added.items() if token.special}

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = True) -> str:
        return str(
            self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        )

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """Render messages with the model's chat template, as transformers does (`tools`: the
        OpenAI-style function specs the template's `tools` variable lists)."""
        if not self.chat_template:
            raise InputError(
                "this model has no chat template",
                "drop --chat and pass the prompt as plain text",
            )
        try:
            from jinja2 import TemplateError
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:  # pragma: no cover - jinja2 is a base dependency
            raise InputError("--chat needs jinja2", "pip install jinja2") from e

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        env.filters["tojson"] = tojson  # as transformers defines it: no HTML escaping
        context: dict[str, Any] = {
            "messages": messages,
            "tools": tools or None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.special.bos_token or "",
            "eos_token": self.special.eos_token or "",
        }
        try:
            return str(env.from_string(self.chat_template).render(**context))
        except TemplateError as e:
            raise InputError(f"the chat template rejected the messages: {e}") from e

    def encode_chat(self, prompt: str, system: str | None = None) -> np.ndarray:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        return self.encode_messages(messages)

    def encode_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> np.ndarray:
        """A conversation (role/content messages) through the chat template, ready to answer."""
        return self.encode(self.render_chat(messages, tools=tools), add_special_tokens=False)

    def stream_decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas that never split a character.

    It decodes a short window (from a prefix offset) instead of the whole text, so the cost per
    step does not grow with the output; text that ends in an incomplete UTF-8 sequence (the
    replacement character) is held back until the next token completes it.
    """

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(int(i) for i in new_ids)
        prefix_text = self.codec.decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self.codec.decode(self.ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end, if any)."""
        prefix_text = self.codec.decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self.codec.decode(self.ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Chat templates' `tojson` filter, as transformers renders it (jinja2's own escapes HTML:
    a tool description's '<' would reach the model as '\u003c')."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )

"""Incremental detokenization never prints a broken character; chat template rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specx.runtime.artifact.contract import SpecialTokens
from specx.runtime.errors import InputError
from specx.runtime.tokenizer import REPLACEMENT_CHAR, TextCodec


@pytest.fixture()
def codec(tokenizer: Any, tmp_path: Path) -> TextCodec:
    import tiny_models

    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    special = SpecialTokens(0, (1,), 2, "<s>", "</s>")
    return TextCodec(path, special, tiny_models.CHAT_TEMPLATE)


@pytest.mark.parametrize(
    "text", ["Größe, naïve café", "東京 🙂 and 🙂🙂", "plain ascii text", "\u00e9\u0301 combining"]
)
def test_streamed_deltas_hold_no_broken_character_and_add_up_to_the_text(
    codec: TextCodec, text: str
) -> None:
    ids = codec.encode(text, add_special_tokens=False).tolist()
    # multi-byte characters must be split across byte-level tokens for this test to mean much
    assert len(ids) > len(text) / 3
    decoder = codec.stream_decoder()
    deltas = [decoder.push([i]) for i in ids]
    deltas.append(decoder.flush())
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == codec.decode(ids) == text


def test_pushing_several_tokens_at_once_gives_the_same_text(codec: TextCodec) -> None:
    ids = codec.encode("🙂 speculative 東京 decoding", add_special_tokens=False).tolist()
    decoder = codec.stream_decoder()
    out = "".join(decoder.push(ids[i : i + 3]) for i in range(0, len(ids), 3)) + decoder.flush()
    assert out == codec.decode(ids)


def test_a_lone_incomplete_character_is_held_back_then_flushed(codec: TextCodec) -> None:
    ids = codec.encode("🙂", add_special_tokens=False).tolist()
    assert len(ids) > 1  # a 4-byte character split over byte tokens
    decoder = codec.stream_decoder()
    assert decoder.push(ids[:1]) == ""
    assert decoder.push(ids[1:]) == "🙂"


def test_chat_messages_render_through_the_template(codec: TextCodec) -> None:
    text = codec.render_chat([{"role": "user", "content": "Hi"}])
    assert text == "<s>user\nHi</s>\n<s>assistant\n"
    ids = codec.encode_chat("Hi", system="Be brief")
    assert codec.decode(ids, skip_special_tokens=False).startswith("<s>system\nBe brief</s>")


def test_chat_without_a_template_is_a_clear_error(codec: TextCodec) -> None:
    codec.chat_template = None
    with pytest.raises(InputError, match="no chat template"):
        codec.encode_chat("Hi")

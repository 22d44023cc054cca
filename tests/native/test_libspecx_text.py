"""libspecx's streaming detokenizer: the text of ids streamed one at a time (or in steps) is
the `tokenizers` library's decode of them all (special tokens skipped, invalid UTF-8 replaced
as decode replaces it), and no chunk ever splits a character. Checked on the tiny tokenizer
here and on SmolLM2's and Qwen's in test_libspecx_real.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from libspecx_tools import Detokenizer, Library, SpecxError, library_path
from tokenizers import Tokenizer

from conftest import needs_exporter

pytestmark = needs_exporter
INVALID_ARGUMENT, ARTIFACT, UNSUPPORTED = 1, 2, 4


@pytest.fixture(scope="module")
def lib() -> Library:
    if not library_path().is_file():
        pytest.skip("libspecx is not built (scripts/build_libspecx.sh)")
    return Library()


def streamed(detok: Detokenizer, ids: list[int], step: int = 1) -> list[bytes]:
    """The chunks of a stream of `ids` pushed `step` at a time, then finished."""
    chunks = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    return [*chunks, detok.finish()]


def assert_streams_like_decode(detok: Detokenizer, tok: Tokenizer, ids: list[int]) -> None:
    want = tok.decode(ids, skip_special_tokens=True)
    for step in (1, 3):
        chunks = streamed(detok, ids, step)
        for chunk in chunks:
            chunk.decode("utf-8")  # strict: a chunk never ends inside a character
        assert b"".join(chunks).decode("utf-8") == want, (ids, step)


def check_tokenizer(lib: Library, artifact: Path, samples: int, length: int) -> None:
    """Random id sequences over the whole vocabulary (invalid UTF-8 and special tokens among
    them), and texts whose characters span several tokens."""
    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    model = lib.load(artifact)
    detok = model.detokenizer()
    try:
        rng = np.random.default_rng(11)
        size = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(samples):
            assert_streams_like_decode(detok, tok, rng.integers(0, size, length).tolist())
        special = sorted(int(i) for i, t in tok.get_added_tokens_decoder().items() if t.special)
        for text in ("héllo wörld ✓ 😀 世界 — ok", "naïve café\n\tdef f(x): return x ** 2"):
            ids = tok.encode(text, add_special_tokens=False).ids
            ids = [*special[:1], *ids, *special[-1:]]
            assert_streams_like_decode(detok, tok, ids)
    finally:
        detok.close()
        model.close()


def test_streamed_text_equals_the_tokenizers_decode_on_the_tiny_tokenizer(
    lib: Library, llama_pair: Any
) -> None:
    check_tokenizer(lib, llama_pair.artifact, samples=200, length=24)


def test_a_character_split_across_ids_waits_for_its_last_byte(
    lib: Library, llama_pair: Any
) -> None:
    tok = Tokenizer.from_file(str(llama_pair.artifact / "tokenizer.json"))
    ids = tok.encode("😀", add_special_tokens=False).ids
    assert len(ids) > 1  # the tiny tokenizer spells the emoji's 4 bytes as separate tokens
    model = lib.load(llama_pair.artifact)
    detok = model.detokenizer()
    chunks = [detok.push([i]) for i in ids]
    assert chunks[:-1] == [b""] * (len(ids) - 1) and chunks[-1] == "😀".encode()
    # cut off at the end: one replacement character, as decode gives it
    assert detok.push(ids[:2]) == b"" and detok.finish() == "\ufffd".encode()
    assert tok.decode(ids[:2]) == "\ufffd"
    assert detok.push(ids) == "😀".encode()  # a new stream after finish
    detok.close()
    model.close()


def test_bad_ids_and_unsupported_decoders_are_refused_by_name(
    lib: Library, llama_pair: Any, tmp_path: Path
) -> None:
    model = lib.load(llama_pair.artifact)
    detok = model.detokenizer()
    for bad in (-1, model.vocab_size):
        with pytest.raises(SpecxError) as caught:
            detok.push([5, bad])
        assert caught.value.code == INVALID_ARGUMENT
        assert f"id {bad} is outside the vocabulary" in caught.value.message
    detok.close()
    model.close()

    copy = tmp_path / "artifact"
    shutil.copytree(llama_pair.artifact, copy)
    spec = json.loads((copy / "tokenizer.json").read_text())
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [{"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Fuse"}],
    }
    (copy / "tokenizer.json").write_text(json.dumps(spec))
    model = lib.load(copy)  # the model runs; only text is refused
    with pytest.raises(SpecxError) as caught:
        model.detokenizer()
    message = caught.value.message
    assert caught.value.code == UNSUPPORTED
    assert "Sequence of Replace ByteFallback Fuse" in message and "host's tokenizer" in message
    model.close()
    (copy / "tokenizer.json").write_text("{not json")
    model = lib.load(copy)
    with pytest.raises(SpecxError) as caught:
        model.detokenizer()
    assert caught.value.code == ARTIFACT and "not valid JSON" in caught.value.message
    model.close()

"""The KV cache: length is the only truth; passes write in place; rollback moves nothing."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime.artifact.contract import Manifest
from specx.runtime.backends import OrtSession
from specx.runtime.kv_cache import KVCache


def test_truncate_and_advance_only_change_the_length() -> None:
    cache = KVCache(num_layers=2, kv_heads=2, head_dim=4, capacity=10)
    addresses = cache.buffer_addresses()
    cache.advance(6)
    cache.truncate(2)
    assert cache.length == 2 and cache.free == 8
    assert cache.buffer_addresses() == addresses


def test_overflow_and_bad_truncation_are_refused() -> None:
    cache = KVCache(num_layers=1, kv_heads=1, head_dim=2, capacity=4)
    cache.advance(4)
    with pytest.raises(Exception, match="overflow"):
        cache.advance(1)
    with pytest.raises(ValueError):
        cache.truncate(5)


def target_session(request: pytest.FixtureRequest, pair_name: str) -> OrtSession:
    pair: TinyPair = request.getfixturevalue(pair_name)
    return OrtSession(pair.artifact / "target.onnx", Manifest.read(pair.artifact).target)


@needs_exporter
@pytest.mark.parametrize("pair_name", ["llama_pair", "llama_plain_pair"])
def test_a_pass_writes_new_keys_in_place_after_the_past(
    request: pytest.FixtureRequest, pair_name: str
) -> None:
    session = target_session(request, pair_name)
    cache = session.new_cache(32)
    addresses = cache.buffer_addresses()
    tokens = np.array([5, 9, 11, 20, 31], dtype=np.int64)
    session.forward(tokens[:3], cache)
    first_keys = cache.keys(0).copy()  # [3, kv_heads, head_dim]
    session.forward(tokens[3:], cache)
    assert cache.length == 5
    assert cache.buffer_addresses() == addresses
    np.testing.assert_array_equal(cache.keys(0)[:3], first_keys)  # the past was not rewritten

    # the same tokens in one pass give the same cache contents (up to float rounding)
    other = session.new_cache(32)
    session.forward(tokens, other)
    np.testing.assert_allclose(other.keys(1), cache.keys(1), atol=1e-5)
    np.testing.assert_allclose(other.values(1), cache.values(1), atol=1e-5)


@needs_exporter
@pytest.mark.parametrize("pair_name", ["llama_pair", "llama_plain_pair"])
def test_rollback_then_rewrite_equals_a_cache_that_never_saw_the_rejected_tokens(
    request: pytest.FixtureRequest, pair_name: str
) -> None:
    session = target_session(request, pair_name)
    cache = session.new_cache(32)
    session.forward(np.array([4, 5, 6, 7, 8, 9]), cache)
    cache.truncate(3)  # reject the last three
    logits = session.forward(np.array([40, 41]), cache).copy()
    clean = session.new_cache(32)
    want = session.forward(np.array([4, 5, 6, 40, 41]), clean)[3:]
    np.testing.assert_allclose(logits, want, atol=1e-4)
    np.testing.assert_allclose(cache.keys(0), clean.keys(0), atol=1e-5)


def test_a_batch_cache_copies_a_prefix_between_rows_and_nothing_else() -> None:
    from specx.runtime.errors import InputError
    from specx.runtime.kv_cache import BatchKVCache, common_prefix

    cache = BatchKVCache(num_layers=2, kv_heads=2, head_dim=4, rows=3, capacity=8)
    keys = cache._buffers[0].to_host()
    keys[0] = np.arange(keys[0].size, dtype=np.float32).reshape(keys[0].shape)
    keys[2] = -1.0
    cache.lengths[:] = [6, 0, 3]
    assert cache.copy_prefix(0, 2, 5)
    assert cache.lengths.tolist() == [6, 0, 5]
    np.testing.assert_array_equal(keys[2, :, :5], keys[0, :, :5])
    assert (keys[2, :, 5:] == -1.0).all()  # past the prefix: untouched
    assert (keys[1] == 0).all()
    with pytest.raises(InputError, match="cannot copy"):
        cache.copy_prefix(0, 1, 7)  # row 0 holds only 6
    assert common_prefix(np.array([1, 2, 3, 4]), np.array([1, 2, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 5])) == 2

"""Prompt reuse across generations (cache.py) and the host store of evicted prefixes
(store.py)."""

from specx.runtime.prefix.cache import PrefixCache, PrefixConfig, Resumed
from specx.runtime.prefix.store import PrefixStore

__all__ = ["PrefixCache", "PrefixConfig", "PrefixStore", "Resumed"]

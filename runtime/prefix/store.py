"""The host-memory prompt store: prefixes whose caches went to other prompts, kept (least recently
used first out, within a byte bound) so that a later prompt starting with one of them copies its
keys and values back instead of computing them (llama-server's ``--cache-ram``; vLLM offloads
prefix blocks to the CPU the same way).

An entry is one cache's valid prefix: its token ids and, per cache buffer, the keys or values of
those positions ([kv_heads, n, head_dim]). It is found only by a prompt of the same scope (a
tenant: runtime/prefix/cache.py) for a cache of the same graph (``key``), so that nothing is
read by another graph than the one that computed it. Entries never change once made; a checksum
taken as the entry is made is checked before it is copied back, and an entry that fails it is
dropped and never served.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from specx.runtime.kv_cache import common_prefix


def checksum(tokens: np.ndarray, values: list[np.ndarray]) -> int:
    """A CRC-32 over the token ids and every buffer's bytes (a few GB/s: small beside the
    prefill it saves)."""
    crc = zlib.crc32(np.ascontiguousarray(tokens).data)
    for data in values:
        crc = zlib.crc32(np.ascontiguousarray(data).data.cast("B"), crc)
    return crc


@dataclass(frozen=True, eq=False)
class Entry:
    key: str  # the graph (and cache layout) whose passes computed it
    scope: str  # whose prompt it is
    tokens: np.ndarray  # [n]
    values: list[np.ndarray]  # per cache buffer: [kv_heads, n, head_dim]
    crc: int

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes) + sum(int(v.nbytes) for v in self.values)

    def intact(self) -> bool:
        return checksum(self.tokens, self.values) == self.crc


@dataclass
class StoreCounts:
    """What the store has done since it was made (the server's /metrics reads them)."""

    saved: int = 0  # entries made
    hits: int = 0  # prompts that copied an entry back
    restored_tokens: int = 0  # positions copied back
    evicted: int = 0  # entries dropped for room
    corrupt: int = 0  # entries whose checksum failed (dropped, never served)


class PrefixStore:
    """Evicted prefixes in host memory, at most `limit_bytes` together."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()
        self.counts = StoreCounts()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def lookup(self, key: str, scope: str, prompt: np.ndarray) -> tuple[Entry | None, int]:
        """The entry of this graph and scope sharing the longest prefix with `prompt`, and that
        length ((None, 0): none shares a token)."""
        best: tuple[Entry | None, int] = (None, 0)
        with self._lock:
            for entry in self._entries.values():
                if entry.key == key and entry.scope == scope:
                    shared = common_prefix(entry.tokens, prompt)
                    if shared > best[1]:
                        best = (entry, shared)
        return best

    def put(self, key: str, scope: str, tokens: np.ndarray, values: list[np.ndarray]) -> bool:
        """Keep a prefix (its data copied by the caller, now the store's). An entry it extends
        is dropped; if an entry already holds it, that one is kept instead. False: larger than
        the whole store."""
        entry = Entry(key, scope, tokens.copy(), values, checksum(tokens, values))
        if entry.nbytes > self.limit_bytes:
            return False
        with self._lock:
            for ident, other in list(self._entries.items()):
                if other.key != key or other.scope != scope:
                    continue
                shared = common_prefix(other.tokens, entry.tokens)
                if shared == entry.tokens.shape[0]:  # held already (maybe with more)
                    self._entries.move_to_end(ident)
                    return True
                if shared == other.tokens.shape[0]:  # the new one extends it
                    self._drop(ident)
            self._entries[id(entry)] = entry
            self._bytes += entry.nbytes
            self.counts.saved += 1
            while self._bytes > self.limit_bytes:
                self._drop(next(iter(self._entries)))
                self.counts.evicted += 1
        return True

    def take(self, entry: Entry, length: int) -> bool:
        """Mark `entry` used for `length` positions, after checking it is intact; False (and the
        entry dropped) if its checksum fails."""
        if not entry.intact():
            with self._lock:
                self.counts.corrupt += 1
                if id(entry) in self._entries:
                    self._drop(id(entry))
            return False
        with self._lock:
            if id(entry) in self._entries:
                self._entries.move_to_end(id(entry))
            self.counts.hits += 1
            self.counts.restored_tokens += length
        return True

    def _drop(self, ident: int) -> None:
        entry = self._entries.pop(ident)
        self._bytes -= entry.nbytes

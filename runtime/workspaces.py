"""The pipeline's workspaces: what one generation alone runs on (a fork of the target's graph
with its own binding, a KV cache, a drafter with its own cache), pooled per drafter.

A generation takes the free workspace whose cache holds the longest prefix of its prompt for
its scope (runtime/prefix keeps that prefix and reads the rest); where none holds any, the least
recently used one (its prefix goes to the host store), and a new one where none is free. It
gives the workspace back when it ends, caches and all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.drafters.base import Drafter
from specx.runtime.kv_cache import KVCache


@dataclass
class Workspace:
    drafter_name: str
    target: GraphSession
    cache: KVCache
    drafter: Drafter | None


class WorkspacePool:
    def __init__(self, make: Callable[[str], Workspace]) -> None:
        """make: a new workspace for a drafter (when none of its is free)."""
        self._make = make
        self._free: dict[str, list[Workspace]] = {}  # per drafter, least recently used first
        self._lock = threading.Lock()

    def acquire(self, drafter_name: str, prompt: np.ndarray, scope: str | None) -> Workspace:
        """A workspace of the drafter for a generation of `prompt` (all its tokens) in `scope`."""
        reading = prompt[:-1]  # what a prompt pass would read: the cache holds no more of it
        with self._lock:
            free = self._free.setdefault(drafter_name, [])
            if free:
                shared = [w.cache.shared_prefix(0, reading, scope) for w in free]
                best = max(range(len(free)), key=lambda i: (shared[i], i))
                return free.pop(best if shared[best] else 0)
        return self._make(drafter_name)

    def release(self, workspace: Workspace) -> None:
        with self._lock:
            self._free[workspace.drafter_name].append(workspace)

    def idle(self, drafter_name: str) -> list[Workspace]:
        """The drafter's free workspaces (each holds its caches), least recently used first."""
        with self._lock:
            return list(self._free.get(drafter_name, []))

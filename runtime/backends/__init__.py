"""Backends: one module per way of running a graph, behind the ``GraphSession`` seam."""

from specx.runtime.backends.base import DEFAULT_CHUNK, GraphSession
from specx.runtime.backends.loader import open_graph
from specx.runtime.backends.ort_session import OrtSession, use_global_thread_pool
from specx.runtime.backends.providers import choose_providers, resolve_providers

__all__ = [
    "DEFAULT_CHUNK",
    "GraphSession",
    "OrtSession",
    "choose_providers",
    "open_graph",
    "resolve_providers",
    "use_global_thread_pool",
]

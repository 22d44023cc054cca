"""Prometheus metrics of a specx server (GET /metrics), one registry per server."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specx.apps.serve.engine import Done
from specx.runtime.prefix.store import PrefixStore


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "specx_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.errors = Counter(
            "specx_errors", "Requests answered with an error, by type", ["type"], registry=r
        )
        self.prompt_tokens = Counter("specx_prompt_tokens", "Prompt tokens read", registry=r)
        self.generated = Counter("specx_generated_tokens", "Tokens generated", registry=r)
        self.proposed = Counter("specx_draft_tokens_proposed", "Draft tokens verified", registry=r)
        self.accepted = Counter("specx_draft_tokens_accepted", "Draft tokens accepted", registry=r)
        self.target_passes = Counter("specx_target_passes", "Target passes", registry=r)
        self.acceptance = Gauge(
            "specx_acceptance_rate", "Accepted / proposed draft tokens, since start", registry=r
        )
        self.tokens_per_s = Gauge(
            "specx_tokens_per_second",
            "New tokens / second of the last finished generation",
            registry=r,
        )
        self.queue_depth = Gauge("specx_queue_depth", "Requests waiting for a slot", registry=r)
        self.active = Gauge("specx_active_requests", "Generations running", registry=r)
        self.duration = Histogram(
            "specx_request_duration_seconds", "Generation time per request", registry=r
        )
        self.first_token = Histogram(
            "specx_time_to_first_token_seconds", "From admission to the first text", registry=r
        )
        self.cache_hits = Counter(
            "specx_prompt_cache_hits",
            "Requests that reused a prompt prefix, by where it was: cache (a cache row kept it), "
            "store (copied back from the host store), row (copied from another batch row)",
            ["source"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "specx_prompt_cache_tokens", "Prompt tokens reused instead of computed", registry=r
        )
        self.store_bytes = Gauge(
            "specx_prompt_cache_store_bytes", "Bytes held by the host prompt store", registry=r
        )
        self.store_entries = Gauge(
            "specx_prompt_cache_store_entries", "Prefixes held by the host store", registry=r
        )
        self.store_events = Gauge(
            "specx_prompt_cache_store_events",
            "Host store events since start: saved, hits, evicted, corrupt (dropped, never served)",
            ["event"],
            registry=r,
        )
        self._lock = threading.Lock()  # finished() runs in worker threads
        self._proposed = self._accepted = 0

    def finished(self, done: Done, first_token_s: float | None) -> None:
        stats = done.result.stats
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generated.inc(stats.new_tokens)
        self.proposed.inc(stats.proposed)
        self.accepted.inc(stats.accepted)
        self.target_passes.inc(stats.target_passes)
        with self._lock:
            self._proposed += stats.proposed
            self._accepted += stats.accepted
            if self._proposed:
                self.acceptance.set(self._accepted / self._proposed)
        if stats.prompt_cache:
            self.cache_hits.labels(stats.prompt_cache).inc()
            self.cached_tokens.inc(stats.reused_prompt_tokens)
        self.tokens_per_s.set(stats.tokens_per_s)
        self.duration.observe(stats.total_s)
        if first_token_s is not None:
            self.first_token.observe(first_token_s)

    def read_store(self, store: PrefixStore | None) -> None:
        """The host store's gauges, read as /metrics is scraped."""
        if store is None:
            return
        self.store_bytes.set(store.nbytes)
        self.store_entries.set(len(store))
        counts = store.counts
        for event, value in (
            ("saved", counts.saved),
            ("hits", counts.hits),
            ("evicted", counts.evicted),
            ("corrupt", counts.corrupt),
        ):
            self.store_events.labels(event).set(value)

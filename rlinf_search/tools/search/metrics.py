"""Client-side search statistics: what the rollout saw (calls, cache, failures) and what it cost (requests)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# Percentiles over the most recent calls: a stable p99 with bounded memory.
_LATENCY_WINDOW = 10_000


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class SearchMetrics:
    """Counters of one client. Updated from its event loop only, so no lock."""

    calls: int = 0
    """``search()`` calls finished."""
    cache_hits: int = 0
    """Calls answered from the LRU cache without a request."""
    shared: int = 0
    """Calls that joined an identical query already in flight instead of sending their own."""
    requests: int = 0
    """Backend requests sent, each retry counted (HTTP POSTs; retriever calls for ``inprocess``). With several
    replicas, a request moved to another replica inside one attempt counts once here; each replica counts its own
    (``LocalRetrievalBackend.replica_metrics``)."""
    queries_sent: int = 0
    """Queries carried by those requests; ``queries_sent / requests`` is the mean batch size."""
    failures: int = 0
    """Calls that ended with ``error`` set."""
    retries: int = 0
    """Attempts repeated after a timeout, connection error or 5xx."""
    latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW), repr=False)
    """Wall time of recent calls, for the mean and percentiles."""

    def record_call(self, latency_s: float, *, failed: bool, from_cache: bool, shared: bool) -> None:
        """Account for one finished ``search()`` call."""
        self.calls += 1
        self.cache_hits += int(from_cache)
        self.shared += int(shared)
        self.failures += int(failed)
        self.latencies_s.append(latency_s)

    def record_request(self, num_queries: int) -> None:
        """Account for one request (one attempt) sent to the backend."""
        self.requests += 1
        self.queries_sent += num_queries

    def snapshot(self) -> dict[str, float | int]:
        """Plain numbers for a logger: counters, rates, and latency mean/p50/p90/p99 in ms."""
        latencies = sorted(self.latencies_s)
        mean_ms = 1000.0 * sum(latencies) / len(latencies) if latencies else 0.0
        return {
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "cache_hit_rate": round(self.cache_hits / self.calls, 4) if self.calls else 0.0,
            "shared": self.shared,
            "requests": self.requests,
            "mean_batch_size": round(self.queries_sent / self.requests, 3) if self.requests else 0.0,
            "failures": self.failures,
            "retries": self.retries,
            "latency_ms_mean": round(mean_ms, 3),
            **{f"latency_ms_p{q}": round(1000.0 * percentile(latencies, q), 3) for q in (50, 90, 99)},
        }

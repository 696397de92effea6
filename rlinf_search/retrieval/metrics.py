"""Counters and latency percentiles for the retrieval server's ``GET /metrics``."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

import numpy as np

# Percentiles over the most recent requests: enough for a stable p99, bounded memory.
_LATENCY_WINDOW = 10_000


class ServerMetrics:
    """Thread-safe request, query, batch and latency statistics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.requests = 0
        self.queries = 0
        self.client_errors = 0
        self.server_errors = 0
        self.client_disconnects = 0
        """Requests whose client closed the connection before the body was read (neither side's error)."""
        self.batches = 0
        self.batch_sizes: Counter[int] = Counter()
        self.search_busy_s = 0.0
        """Seconds batch threads spent searching, summed over threads: against wall time, how much of the server's
        life the encoder computed (the rest is HTTP, batching and idle time)."""
        self._latencies_ms: deque[float] = deque(maxlen=_LATENCY_WINDOW)

    def record_request(self, num_queries: int, latency_s: float) -> None:
        with self._lock:
            self.requests += 1
            self.queries += num_queries
            self._latencies_ms.append(latency_s * 1000.0)

    def record_batch(self, num_queries: int) -> None:
        with self._lock:
            self.batches += 1
            self.batch_sizes[num_queries] += 1

    def record_search_time(self, seconds: float) -> None:
        with self._lock:
            self.search_busy_s += seconds

    def record_error(self, status: int) -> None:
        with self._lock:
            if status >= 500:
                self.server_errors += 1
            else:
                self.client_errors += 1

    def record_disconnect(self) -> None:
        with self._lock:
            self.client_disconnects += 1

    def snapshot(self) -> dict:
        with self._lock:
            latencies = np.asarray(self._latencies_ms, dtype=np.float64)
            sizes = dict(sorted(self.batch_sizes.items()))
            total_batched = sum(size * count for size, count in sizes.items())
            snapshot = {
                "uptime_s": round(time.time() - self.started_at, 3),
                "requests": self.requests,
                "queries": self.queries,
                "client_errors": self.client_errors,
                "server_errors": self.server_errors,
                "client_disconnects": self.client_disconnects,
                "batches": self.batches,
                "mean_batch_size": round(total_batched / self.batches, 3) if self.batches else 0.0,
                "batch_size_histogram": {str(k): v for k, v in sizes.items()},
                "search_busy_s": round(self.search_busy_s, 6),
            }
        for q in (50, 90, 99):
            value = float(np.percentile(latencies, q)) if latencies.size else 0.0
            snapshot[f"latency_ms_p{q}"] = round(value, 3)
        return snapshot

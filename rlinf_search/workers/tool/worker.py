"""A rank of the SearchTool group: one search client that every rollout rank's agent loops share.

Each rollout rank opening its own client splits the cache, the coalescing window, the concurrency cap and
the rate limit ``rollout ranks`` ways: eight ranks searching the same GRPO group's query send it eight
times, and a web API's rate limit has to be divided by hand. The group owns the client instead (verl's
search tool has its own Ray workers, ``num_workers``, for the same reason). Queries are dealt to ranks by a
hash of their normal form, so a query always meets the cache that has seen it; each rank has its share of
``max_concurrency`` and ``rate_limit_per_s``, so the group together keeps the configured limits.
"""

from __future__ import annotations

import math
import os

from rlinf_search.scheduler import Worker
from rlinf_search.tools.search import SearchOutcome, SearchToolConfig, build_search_tool
from rlinf_search.tools.search.client import SearchClient


def rank_share(config: SearchToolConfig, ranks: int) -> SearchToolConfig:
    """The limits one of ``ranks`` tool ranks may use, so that together they keep ``config``'s: the
    concurrency cap split (at least one each), the rate limit split, the cache split."""
    if ranks <= 1:
        return config
    return config.replace(
        max_concurrency=max(1, config.max_concurrency // ranks),
        rate_limit_per_s=config.rate_limit_per_s / ranks,
        cache_size=math.ceil(config.cache_size / ranks) if config.cache_size else 0)


class SearchToolWorker(Worker):
    """Answers ``search`` calls from any rank of any group (a Ray async actor: many calls at once, one
    event loop, so the client's cache and coalescing see every caller)."""

    def __init__(self, search: SearchToolConfig):
        self.config = search
        self._client: SearchClient | None = None

    def _ensure_client(self) -> SearchClient:
        # Built on first use, inside the actor's event loop: the client's futures belong to that loop.
        if self._client is None:
            self._client = build_search_tool(rank_share(self.config, self.world_size))
        return self._client

    async def search(self, query: str, topk: int | None = None) -> SearchOutcome:
        """One query through this rank's client; failures come back as ``SearchOutcome.error``."""
        return await self._ensure_client().search(query, topk)

    async def stats(self) -> dict[str, float | int]:
        """This rank's client counters (calls, cache hits, requests sent, latency percentiles), and with several
        retrieval replicas each one's as ``replica/<host:port>/<counter>``; ``process_id``: this process's, which
        tells a rank Ray started again."""
        client = self._ensure_client()
        replicas = getattr(client.backend, "replica_metrics", dict)()
        if len(replicas) < 2:
            replicas = {}  # one server: its counters are the client's
        return {**client.metrics.snapshot(), "process_id": os.getpid(),
                **{f"replica/{addr}/{name}": value for addr, counters in replicas.items()
                   for name, value in counters.items()}}

    async def aclose(self) -> None:
        """Close the client (queued queries fail with a 'closed' error); the next call opens a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

"""``GroupSearchTool``: the ``SearchTool`` an agent loop uses when a SearchTool group owns the client.

A rollout rank holds the group's actor handles (plain Ray handles travel as arguments) and sends each
query to the rank its normal form hashes to; the answer comes back as the ``SearchOutcome`` the client
made. A tool rank that dies or raises becomes an error outcome for that query (the rollout writes an
error observation and goes on), never an exception in the agent loop.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

from ray.actor import ActorHandle
from ray.exceptions import RayError

from rlinf_search.tools.search.base import SearchOutcome
from rlinf_search.tools.search.limits import normalise_query


def tool_rank(query: str, ranks: int) -> int:
    """The tool rank that serves ``query``: a stable hash of its normal form (the same query, whatever its
    spacing, always meets the same cache; Python's own ``hash`` differs between processes)."""
    digest = hashlib.blake2b(normalise_query(query).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % ranks


class GroupSearchTool:
    """Calls the SearchTool group's ranks; one per rollout call, like the client it stands in for."""

    def __init__(self, actors: Sequence[ActorHandle]):
        if not actors:
            raise ValueError("GroupSearchTool needs the SearchTool group's actors (tools.search.num_workers >= 1)")
        self.actors = list(actors)

    async def search(self, query: str, topk: int | None = None) -> SearchOutcome:
        rank = tool_rank(query, len(self.actors))
        started = time.monotonic()
        try:
            return await self.actors[rank].search.remote(query, topk)
        except RayError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return SearchOutcome(query=normalise_query(query), latency_s=time.monotonic() - started, infra=True,
                                 error=f"search tool rank {rank} failed: {type(exc).__name__}: {reason}")

    async def aclose(self) -> None:
        """Nothing to release here: the group's ranks keep their clients (and caches) across calls."""

"""The search backend contract; the HTTP helpers and failure kinds every backend shares are in
``rlinf_search.net.http``."""

from __future__ import annotations

from typing import Protocol

from rlinf_search.net.http import FinalBackendError, TransientBackendError, make_http_client, one_line, post_json
from rlinf_search.tools.search.base import SearchHit

__all__ = ["FinalBackendError", "SearchBackend", "TransientBackendError", "make_http_client", "one_line", "post_json"]


class SearchBackend(Protocol):
    """One way of answering queries; ``SearchClient`` adds retries, limits, caching and batching."""

    target: str
    """Where searches go, for error lines and logs; never holds a credential."""
    batched: bool
    """One ``fetch`` may carry many queries (coalescing applies only then)."""

    async def fetch(self, queries: list[str], topk: int, timeout_s: float) -> list[list[SearchHit]]:
        """Hits per query, in order. Raise ``TransientBackendError`` or ``FinalBackendError`` on failure."""
        ...

    async def aclose(self) -> None:
        """Release connections, threads or loaded indexes."""
        ...

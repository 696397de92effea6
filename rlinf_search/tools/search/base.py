"""The search tool interface: what the agent loop calls, and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SearchHit:
    """One retrieved passage."""

    title: str
    """Passage title (the first line of Search-R1 ``contents``, quotes removed)."""
    text: str
    """Passage body."""
    score: float | None = None
    """Retriever score, when the backend gives one."""
    url: str | None = None
    """Source URL (web search, ASearcher corpora)."""


@dataclass
class SearchOutcome:
    """The result of one query; a failure is a value here, never an exception out of the tool."""

    query: str
    """The query as sent."""
    hits: list[SearchHit] = field(default_factory=list)
    """Passages, best first; empty on error."""
    error: str | None = None
    """One-line reason the search failed (dead server, timeout, bad key); None on success."""
    infra: bool = False
    """With ``error``: the service or the set-up failed (unreachable, timed out, 5xx after retries, an answer it
    could not read, a lost tool rank), not the query. Such a failure is never a training signal: the
    trajectory that met it is not trained (``Trajectory.infra_error``). False: the query itself was refused
    (empty, or HTTP 400/413/422), which is the model's doing."""
    from_cache: bool = False
    """Answered from the client's LRU cache."""
    latency_s: float = 0.0
    """Wall time of this call."""


class SearchTool(Protocol):
    """An async search client. Implementations: ``local``, ``serper``, ``inprocess``."""

    async def search(self, query: str, topk: int | None = None) -> SearchOutcome:
        """Search one query; never raises for backend failures (they come back as ``error``)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...

"""The ``empty`` backend: no retriever at all; every query finds nothing, and the model reads the no-results line.

For runs that exercise the pipeline without a retrieval server (RLinf's ``tools.search.dummy_mode: true``, which
answers every search with "No search results are found."). Nothing learnable comes from it: a model trained
this way learns that searching never helps.
"""

from __future__ import annotations

from rlinf_search.tools.search.base import SearchHit
from rlinf_search.tools.search.config import SearchToolConfig


class EmptyBackend:
    """Answers every query at once with no passages."""

    target = "no retriever (tools.search.backend: empty)"
    batched = True

    async def fetch(self, queries: list[str], topk: int, timeout_s: float) -> list[list[SearchHit]]:
        return [[] for _ in queries]

    async def aclose(self) -> None:
        pass


def build_empty_backend(config: SearchToolConfig) -> EmptyBackend:
    """Registry factory for ``backend: empty``."""
    return EmptyBackend()

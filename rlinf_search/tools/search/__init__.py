"""Search clients for the agent loop: ``build_search_tool(SearchToolConfig(...))`` returns a ``SearchTool``.

Built-in backends are in ``SEARCH_BACKENDS`` keyed by the config's ``backend`` name; your own is a
dotted path (``package.module:factory``) to a function ``(SearchToolConfig) -> SearchBackend``.
"""

from __future__ import annotations

from collections.abc import Callable

from rlinf_search.registry import Registry
from rlinf_search.tools.search.base import SearchHit, SearchOutcome, SearchTool
from rlinf_search.tools.search.client import SearchClient
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.tools.search.empty import build_empty_backend
from rlinf_search.tools.search.local import build_local_backend
from rlinf_search.tools.search.observation import format_observation
from rlinf_search.tools.search.serper import build_serper_backend
from rlinf_search.tools.search.transport import SearchBackend

BackendFactory = Callable[[SearchToolConfig], SearchBackend]


def _build_inprocess_backend(config: SearchToolConfig) -> SearchBackend:
    # Imported on use: it loads torch (about 2 s), which an HTTP-only agent worker never needs.
    from rlinf_search.tools.search.inprocess import build_inprocess_backend

    return build_inprocess_backend(config)


SEARCH_BACKENDS: Registry[BackendFactory] = Registry("search backend")
"""Backend factories by the name ``tools.search.backend`` uses (or a dotted path to one)."""
SEARCH_BACKENDS.register("local", build_local_backend)
SEARCH_BACKENDS.register("serper", build_serper_backend)
SEARCH_BACKENDS.register("inprocess", _build_inprocess_backend)
SEARCH_BACKENDS.register("empty", build_empty_backend)


def build_search_tool(config: SearchToolConfig) -> SearchClient:
    """Build the configured backend (reading keys, loading indexes now) and wrap it in a ``SearchClient``."""
    factory = SEARCH_BACKENDS.resolve(config.backend, key="tools.search.backend")
    return SearchClient(config, factory(config))


__all__ = ["SEARCH_BACKENDS", "SearchClient", "SearchHit", "SearchOutcome", "SearchTool", "SearchToolConfig",
           "build_search_tool", "format_observation"]

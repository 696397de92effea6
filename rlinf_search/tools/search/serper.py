"""The ``serper`` backend: Google results through serper.dev, one query per request.

``POST {serper_url}`` with header ``X-API-KEY`` and body ``{"q": query, "num": k}`` answers
``{"organic": [{"title", "link", "snippet", ...}], ...}``. Serper has no batch endpoint, so the
client does not coalesce for it; the cache and rate limit still apply (requests are billed).

The key is read from ``SERPER_API_KEY`` when the tool is built and held only inside
``_ApiKey``, whose repr is redacted; error lines pass through ``_redact`` in case a server echoes it.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from rlinf_search.tools.search.base import SearchHit
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.tools.search.transport import FinalBackendError, make_http_client, post_json

SERPER_KEY_ENV = "SERPER_API_KEY"


class _ApiKey:
    """A credential that prints as ``<redacted>`` wherever an object graph gets logged or repr'd."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        """The key itself, for the request header only."""
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__


def parse_organic(body: Any, topk: int) -> list[SearchHit]:
    """Serper's ``organic`` results as hits: title, snippet as text, link as url."""
    if not isinstance(body, dict):
        raise FinalBackendError("sent a malformed response (not a JSON object)")
    organic = body.get("organic", [])
    if not isinstance(organic, list):
        raise FinalBackendError("sent a malformed response ('organic' is not a list)")
    hits = []
    for item in organic[:topk]:
        if isinstance(item, dict):
            link = item.get("link")
            hits.append(SearchHit(title=str(item.get("title", "")), text=str(item.get("snippet", "")),
                                  url=str(link) if link else None))
    return hits


class SerperBackend:
    """HTTP client of serper.dev (or anything speaking its API, such as the loopback fake in tests)."""

    batched = False

    def __init__(self, url: str, api_key: str, *, max_connections: int):
        self.target = urlsplit(url).netloc
        self._url = url
        self._key = _ApiKey(api_key)
        # trust_env on: unlike the local server, this goes to the internet and may need the proxy.
        self._http = make_http_client(max_connections, trust_env=True)

    def __repr__(self) -> str:
        return f"SerperBackend(target={self.target!r})"

    def _redact(self, text: str) -> str:
        return text.replace(self._key.reveal(), "<redacted>")

    async def fetch(self, queries: list[str], topk: int, timeout_s: float) -> list[list[SearchHit]]:
        """One request per query (the client sends one at a time because ``batched`` is False)."""
        if len(queries) != 1:
            raise ValueError(f"SerperBackend.fetch takes one query, got {len(queries)}")
        headers = {"X-API-KEY": self._key.reveal(), "Content-Type": "application/json"}
        try:
            body = await post_json(self._http, self._url, {"q": queries[0], "num": topk},
                                   timeout_s=timeout_s, headers=headers)
        except FinalBackendError as exc:
            raise FinalBackendError(self._redact(exc.reason), request_refused=exc.request_refused) from None
        return [parse_organic(body, topk)]

    async def aclose(self) -> None:
        await self._http.aclose()


def build_serper_backend(config: SearchToolConfig) -> SerperBackend:
    """Registry factory for ``backend: serper``; fails at build time when the key is missing."""
    api_key = os.environ.get(SERPER_KEY_ENV, "").strip()
    if not api_key:
        raise ValueError(f"tools.search.backend=serper needs an API key in the environment variable "
                         f"{SERPER_KEY_ENV} (get one at https://serper.dev)")
    return SerperBackend(config.serper_url, api_key, max_connections=config.max_concurrency)

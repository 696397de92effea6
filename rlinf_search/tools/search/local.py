"""The ``local`` backend: any Search-R1-compatible retrieval server (ours, Search-R1's, RLinf's, ASearcher's).

``POST http://{server_addr}/retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}`` (to one of
several replicas when ``server_addr`` lists them: ``replicas.py``) answers ``{"result": [[hit, ...] per query]}``, where a hit is ``{"document": {...}, "score": s}``
or, from servers that ignore ``return_scores``, the document itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from rlinf_search.retrieval.corpus import split_contents
from rlinf_search.tools.search.base import SearchHit
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.tools.search.replicas import ReplicaSet
from rlinf_search.tools.search.transport import (
    FinalBackendError,
    TransientBackendError,
    make_http_client,
    one_line,
    post_json,
)


def parse_document(item: Any) -> SearchHit:
    """One hit in either shape. Explicit ``title``/``text`` win; else ``contents`` is split
    (first line the title, quotes removed)."""
    if not isinstance(item, dict):
        raise FinalBackendError(f"sent a hit that is not an object: {one_line(repr(item), 80)}")
    document, score = item, None
    if isinstance(item.get("document"), dict):
        document, score = item["document"], item.get("score")
    if "text" in document:
        title, text = str(document.get("title", "")), str(document["text"])
    elif "contents" in document:
        title, text = split_contents(str(document["contents"]))
    else:
        raise FinalBackendError(f"sent a document with neither 'contents' nor 'text' (keys {sorted(document)})")
    url = document.get("url")
    return SearchHit(title=title, text=text, score=float(score) if isinstance(score, (int, float)) else None,
                     url=str(url) if url else None)


def parse_retrieve_response(body: Any, num_queries: int, topk: int) -> list[list[SearchHit]]:
    """Hits per query from a ``/retrieve`` body, at most ``topk`` each, checking the shape on the way."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != num_queries:
        got = f"{len(result)} result lists" if isinstance(result, list) else "no 'result' list"
        raise FinalBackendError(f"sent a malformed /retrieve response ({got} for {num_queries} queries)")
    parsed = []
    for hits in result:
        if not isinstance(hits, list):
            raise FinalBackendError("sent a malformed /retrieve response (a query's hits are not a list)")
        parsed.append([parse_document(hit) for hit in hits[:topk]])
    return parsed


class LocalRetrievalBackend:
    """Batched HTTP client of one retrieval server or several replicas (``replicas.py``), over one pooled
    ``httpx.AsyncClient``."""

    batched = True

    def __init__(self, server_addrs: str | tuple[str, ...], *, max_connections: int, eject_after: int = 2,
                 probe_interval_s: float = 5.0):
        addrs = (server_addrs,) if isinstance(server_addrs, str) else tuple(server_addrs)
        self.target = ",".join(addrs)
        # trust_env off: the server is on loopback or the cluster network, and a proxy set for
        # outside traffic (HTTP_PROXY) would otherwise swallow these requests.
        self._http = make_http_client(max_connections, trust_env=False)
        # Probes have a pool of their own: in the requests' pool one could take the slot a request was granted.
        self._probe_http = make_http_client(2, trust_env=False) if len(addrs) > 1 else None
        self.replicas = ReplicaSet(addrs, eject_after=eject_after, probe_interval_s=probe_interval_s,
                                   probe=self._alive)

    def __repr__(self) -> str:
        return f"LocalRetrievalBackend(target={self.target!r})"

    async def fetch(self, queries: list[str], topk: int, timeout_s: float) -> list[list[SearchHit]]:
        """One ``POST /retrieve`` for all ``queries``, moved to another replica while one fails."""
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        tried: set[str] = set()
        failure: TransientBackendError | None = None
        while (replica := self.replicas.choose(tried)) is not None:
            tried.add(replica.addr)
            replica.requests += 1
            replica.in_flight += 1
            try:
                # Each replica gets its own limit, so a hung one leaves time for the next (the client's attempt
                # limit covers every replica once: search_retry_policy).
                async with asyncio.timeout(timeout_s):
                    body = await post_json(self._http, f"http://{replica.addr}/retrieve", payload,
                                           timeout_s=timeout_s)
            except TimeoutError:
                failure = TransientBackendError("timed out", f"no answer in {timeout_s:g} s")
                self.replicas.failed(replica, str(failure))
                continue
            except TransientBackendError as exc:
                self.replicas.failed(replica, str(exc))
                failure = exc
                continue
            finally:
                replica.in_flight -= 1
            self.replicas.answered(replica)
            return parse_retrieve_response(body, len(queries), topk)
        assert failure is not None  # choose() offers every replica once, so at least one attempt was made
        raise failure

    def replica_metrics(self) -> dict[str, dict[str, int]]:
        """Requests, failures, ejections, in-flight requests and admission per replica address."""
        return self.replicas.snapshot()

    async def _alive(self, addr: str) -> bool:
        """``GET /health`` answered below 500: ours answers 200; servers without the route (RLinf's and
        Search-R1's serve only ``/retrieve``) answer 404, which still says the process is up and serving."""
        try:
            response = await self._probe_http.get(f"http://{addr}/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code < 500

    async def aclose(self) -> None:
        await self.replicas.aclose()
        await self._http.aclose()
        if self._probe_http is not None:
            await self._probe_http.aclose()


def build_local_backend(config: SearchToolConfig) -> LocalRetrievalBackend:
    """Registry factory for ``backend: local``."""
    return LocalRetrievalBackend(config.server_addrs, max_connections=config.max_concurrency,
                                 eject_after=config.replica_eject_after,
                                 probe_interval_s=config.replica_probe_interval_s)

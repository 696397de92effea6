"""``SearchToolConfig``: which backend answers searches, and how hard the client may push it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator

from rlinf_search.section_model import ConfigSection, parse_section


class SearchToolConfig(ConfigSection):
    """Typed view of the ``tools.search`` config group (RLinf spells the address ``server_addr`` too)."""

    config_path = "tools.search"

    backend: str = "local"
    """``local`` (a Search-R1-compatible retrieval server), ``serper`` (Google via serper.dev),
    ``inprocess`` (a retriever loaded in this process), or ``package.module:factory`` for your own."""
    server_addr: str | tuple[str, ...] = "127.0.0.1:8000"
    """``host:port`` of the retrieval server for ``local`` (Search-R1's launcher listens on 8000), or a list of
    replicas serving the same index: each request goes to the one with the fewest in flight, and moves on
    when one fails (``tools/search/replicas.py``)."""
    replica_eject_after: int = Field(2, ge=1)
    """With several replicas: failed requests in a row (unreachable, timed out, 5xx) after which one is set
    aside until its health probe passes."""
    replica_probe_interval_s: float = Field(5.0, gt=0)
    """With several replicas: seconds between ``GET /health`` probes of a set-aside one."""
    topk: int = Field(3, ge=1)
    """Passages per query when the caller gives none; the Search-R1 paper uses 3."""
    timeout_s: float = Field(30.0, gt=0)
    """Limit on one HTTP attempt (with several replicas, on each replica an attempt tries). An e5 server batching a few hundred queries answers in seconds,
    so this only catches a server that has stopped answering."""
    deadline_s: float = Field(90.0, gt=0, json_schema_extra={"relation": ">= timeout_s"})
    """Limit on one ``search()`` call, retries and waits included: past it the rollout gets an
    error observation instead of stalling its whole batch."""
    max_retries: int = Field(2, ge=0)
    """Retries after the first attempt on timeouts, connection errors and 5xx (3 attempts in all).
    A 4xx other than 429 (too many requests) is never retried: the same request would be refused again."""
    backoff_base_s: float = Field(0.5, ge=0)
    """First retry waits up to this long; each later one up to twice the previous (full jitter),
    so a fleet of rollout workers does not hammer a restarting server in lock-step."""
    backoff_max_s: float = Field(8.0, ge=0, json_schema_extra={"relation": ">= backoff_base_s"})
    """Cap on a single backoff wait."""
    max_concurrency: int = Field(64, ge=1)
    """HTTP requests in flight at once from this client; also the connection-pool size."""
    rate_limit_per_s: float = Field(0.0, ge=0)
    """Requests started per second (token bucket); 0 means unlimited. Web APIs bill and throttle
    per request, a local server does not need it."""
    num_workers: int = Field(0, ge=0)
    """Ranks of the SearchTool group, which owns the search client for the whole cluster: one cache, one
    coalescing window, and the concurrency cap and rate limit above kept by all rollout ranks together
    (verl's tool ``num_workers``). Each rank serves the queries that hash to it, with its share of the
    limits and the cache. 0: no group; each rollout rank opens its own client for each rollout call, with
    the limits above each (a single rollout rank, as on a CPU, loses nothing)."""
    cache_size: int = Field(10_000, ge=0)
    """LRU entries keyed on (normalised query, topk); 0 disables. GRPO samples the same prompt
    several times, so identical queries are common within a step."""
    coalesce_window_s: float = Field(0.005, ge=0)
    """How long the first query of a batch waits for others before one batched ``POST /retrieve``
    goes out. Small next to a retrieval round trip, long enough to catch a burst of rollouts."""
    max_batch: int = Field(64, ge=1)
    """Most queries in one batched request (a full batch goes out at once); 1 turns coalescing off."""
    serper_url: str = "https://google.serper.dev/search"
    """Endpoint for ``serper``; tests point it at a loopback server. The key comes from the
    ``SERPER_API_KEY`` environment variable, never from config, so it cannot leak into config dumps."""
    index_dir: str | None = None
    """For ``inprocess``: the folder written by ``rlinf_search.retrieval.build_index``."""
    corpus: str | None = None
    """For ``inprocess``: the corpus jsonl the index was built on."""
    retriever: str = "bm25"
    """For ``inprocess``: ``bm25``, ``hybrid`` or a dense encoder name (BM25 loads in well under a second)."""
    tool_config: str | None = None
    """A verl tool config or rllm tool schema file whose settings were applied over this section at start-up
    (``config/sections.py``), and whose schema ``agent.protocol: toolcall`` offers; None: none."""

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> SearchToolConfig:
        """Build from the ``tools.search`` section; a null value means the field's default."""
        return parse_section(cls, dict(section), path="tools.search")

    @property
    def server_addrs(self) -> tuple[str, ...]:
        """``server_addr`` as a tuple of replicas (one for a single server)."""
        return (self.server_addr,) if isinstance(self.server_addr, str) else self.server_addr

    @field_validator("server_addr", mode="before")
    @classmethod
    def _addresses(cls, value: Any) -> Any:
        if not isinstance(value, str) and (isinstance(value, (Mapping, bytes)) or not hasattr(value, "__iter__")):
            raise ValueError("must be 'host:port' or a list of them")
        return value if isinstance(value, str) else tuple(value)  # OmegaConf's ListConfig too

    @model_validator(mode="after")
    def _check(self) -> SearchToolConfig:
        self._check_backend()
        self._check_numbers()
        self._check_backend_fields()
        return self

    def _check_backend(self) -> None:
        # The registry sits beside the factories, which import this module: looked up when checked.
        from rlinf_search.tools.search import SEARCH_BACKENDS

        SEARCH_BACKENDS.resolve(self.backend, key="tools.search.backend")

    def _check_numbers(self) -> None:
        if self.deadline_s < self.timeout_s:
            raise ValueError(f"tools.search.deadline_s ({self.deadline_s}) must be >= timeout_s "
                             f"({self.timeout_s}): the deadline covers every attempt")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(f"tools.search.backoff_max_s ({self.backoff_max_s}) must be >= "
                             f"backoff_base_s ({self.backoff_base_s})")

    def _check_backend_fields(self) -> None:
        if self.backend == "local":
            if not self.server_addrs:
                raise ValueError("tools.search.server_addr is an empty list; give 'host:port' or a list of them")
            for addr in self.server_addrs:
                host, sep, port = addr.rpartition(":") if isinstance(addr, str) else ("", "", "")
                if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                    raise ValueError(f"tools.search.server_addr must be 'host:port' or a list of them, got {addr!r}")
            if len(set(self.server_addrs)) != len(self.server_addrs):
                raise ValueError(f"tools.search.server_addr lists a replica twice: {list(self.server_addrs)}")
        if self.backend == "serper" and not self.serper_url.startswith(("http://", "https://")):
            raise ValueError(f"tools.search.serper_url must be an http(s) URL, got {self.serper_url!r}")
        if self.backend == "inprocess":
            for name in ("index_dir", "corpus"):
                if not getattr(self, name):
                    raise ValueError(f"tools.search.{name} is required for the inprocess backend")

"""The ``access`` tool: open a web page by its URL, as ASearcher's agents do, from a retrieval server's page store
(``POST /access`` with ``{"urls": [url]}``; a server started with ``--pages FILE``, docs/agents.md).

Settings (``tools.access``): ``server_addr`` (null: ``tools.search.server_addr``, its first replica when it lists
several), ``max_page_tokens`` (a longer page is cut), ``timeout_s``. A URL the store does not have, a server that
fails and a call without a URL each come back to the model as one line, and are counted (``not_found``,
``backend``, ``arguments``).
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from rlinf_search.agents.tools.base import ToolResult, tool_name
from rlinf_search.net.http import (
    FinalBackendError,
    TransientBackendError,
    make_http_client,
    one_line,
    post_json,
)
from rlinf_search.plugin_settings import with_settings
from rlinf_search.tools.search.observation import truncate_passage

ACCESS_SCHEMA = {
    "type": "function",
    "function": {
        "name": "access",
        "description": "Open a web page by its URL and read its text.",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string", "description": "The page's URL, as a search result gave it."}},
            "required": ["url"],
        },
    },
}
"""The function the model sees (our wording; ASearcher's agents call it ``access`` with a ``url``)."""


class AccessSettings(BaseModel):
    """``tools.access``, validated at start-up (``plugin_settings.read_settings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    server_addr: str
    """``host:port`` of the retrieval server whose ``/access`` serves the pages."""
    max_page_tokens: int = Field(500, ge=1)
    """A page longer than this many tokens is cut (the observation budget, ``max_tool_response_length``, still
    applies on top)."""
    timeout_s: float = Field(30.0, gt=0)
    """Seconds one request may take."""


@with_settings(AccessSettings)
class AccessTool:
    """Pages by URL from a page store, over one pooled HTTP client (open it in the event loop that calls it)."""

    schema = ACCESS_SCHEMA
    name = tool_name(ACCESS_SCHEMA)
    error_kinds = ("arguments", "not_found", "backend")
    reads_server = True
    """``server_addr`` defaults to ``tools.search.server_addr`` (the retrieval server serves the pages too; the first
    replica of several)."""

    def __init__(self, settings: AccessSettings, *, tokenizer=None):
        self.settings, self.tokenizer = settings, tokenizer
        self._url = f"http://{self.settings.server_addr}/access"
        self._http = make_http_client(8, trust_env=False)

    async def call(self, arguments: dict) -> ToolResult:
        url = arguments.get("url")
        if not isinstance(url, str) or not url.strip():
            return ToolResult("Error: access needs url, the page's address as a string", error="arguments")
        started = time.perf_counter()
        try:
            body = await post_json(self._http, self._url, {"urls": [url.strip()]}, timeout_s=self.settings.timeout_s)
            result = body.get("result") if isinstance(body, dict) else None
            if not isinstance(result, list) or len(result) != 1 or not isinstance(result[0], (dict, type(None))):
                raise FinalBackendError("sent a malformed /access response")
        except (TransientBackendError, FinalBackendError) as exc:
            text = f"Error: the page store at {self.settings.server_addr} {one_line(str(exc))}."
            refused = isinstance(exc, FinalBackendError) and exc.request_refused
            return ToolResult(text, error="backend", seconds=time.perf_counter() - started,
                              infra_error=None if refused else text.removeprefix("Error: "))
        page, seconds = result[0], time.perf_counter() - started
        if page is None:
            return ToolResult(f"No page found at {url.strip()}.", error="not_found", seconds=seconds)
        return ToolResult(self._page_text(page), seconds=seconds)

    def _page_text(self, page: dict) -> str:
        text = str(page.get("contents") or page.get("text") or "")
        title = page.get("title")
        text = truncate_passage(text.strip(), self.settings.max_page_tokens, self.tokenizer)
        return f"Title: {title}\n{text}" if title else text

    async def aclose(self) -> None:
        await self._http.aclose()

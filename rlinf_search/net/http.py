"""One JSON POST over httpx, and the two kinds of failure a remote service has: worth retrying or not."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx

# Enough of a refusal message to see what was wrong without flooding a log line or an observation.
_DETAIL_CHARS = 160


class TransientBackendError(Exception):
    """A failure worth retrying: timeout, connection refused or reset, HTTP 5xx."""

    def __init__(self, what: str, cause: str):
        super().__init__(f"{what} ({cause})")
        self.what = what
        """Adjective for the error line: ``unreachable``, ``timed out``, ``failing``."""
        self.cause = cause
        """The exception class or status behind it: ``ConnectError``, ``HTTP 503``."""


# The statuses that refuse what a request asked for (its content), not who sent it or where: a search query the
# server will not take is the caller's doing. 401, 403, 404 and the like say the client is set up wrong.
_REQUEST_REFUSED = frozenset({400, 413, 414, 422})


class FinalBackendError(Exception):
    """A failure retrying cannot fix: a 4xx, a response that is not the expected shape."""

    def __init__(self, reason: str, *, request_refused: bool = False):
        super().__init__(reason)
        self.reason = reason
        """Completes ``<service> at X ...``: e.g. ``rejected the request (HTTP 400: ...)``."""
        self.request_refused = request_refused
        """The service refused the request's content (HTTP 400, 413, 414, 422): the caller's input was at fault.
        False for everything that is the service's or the set-up's doing (a malformed answer, 401, 404)."""


def one_line(text: str, limit: int = _DETAIL_CHARS) -> str:
    """Collapse whitespace and cut, so a server's message fits in one log or observation line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def make_http_client(max_connections: int, *, trust_env: bool, proxy: str | None = None) -> httpx.AsyncClient:
    """A pooled client sized to the concurrency cap, so no request waits for a connection slot
    that the semaphore has already granted. ``trust_env``: follow the environment's proxy settings;
    ``proxy``: this proxy URL, whatever the environment says."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    trust = trust_env and proxy is None
    return httpx.AsyncClient(limits=limits, trust_env=trust, proxy=proxy, verify=_tls_context(trust))


@functools.cache
def _tls_context(trust_env: bool) -> ssl.SSLContext:
    """The verifying TLS context httpx would build for a client, built once per process: building one loads the CA
    bundle, about 20 ms on a 2-core CPU, and a rollout rank makes a search client for every rollout call."""
    return httpx.create_ssl_context(trust_env=trust_env)


def _refusal_detail(response: httpx.Response) -> str:
    """The server's own reason: our servers and most others send ``{"error": ...}``, ``{"detail": ...}``
    or OpenAI's ``{"error": {"message": ...}}``."""
    try:
        body = response.json()
    except ValueError:
        return one_line(response.text)
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            if key in body:
                value = body[key]
                # OpenAI-compatible servers nest it: {"error": {"message": ..., "type": ...}}
                if isinstance(value, dict) and "message" in value:
                    value = value["message"]
                return one_line(str(value))
    return one_line(response.text)


async def post_json(http: httpx.AsyncClient, url: str, payload: dict, *, timeout_s: float,
                    headers: dict[str, str] | None = None) -> Any:
    """POST ``payload`` as JSON and return the decoded body, classifying every failure."""
    try:
        response = await http.post(url, json=payload, headers=headers, timeout=timeout_s)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise TransientBackendError("unreachable", type(exc).__name__) from None
    except httpx.TimeoutException as exc:
        raise TransientBackendError("timed out", type(exc).__name__) from None
    except httpx.TransportError as exc:  # reset, closed mid-response, protocol error: a dying server
        raise TransientBackendError("failing", type(exc).__name__) from None
    # 429 is a 4xx that asks to come back later (web search APIs throttle per key): retry it.
    if response.status_code >= 500 or response.status_code == 429:
        raise TransientBackendError("failing", f"HTTP {response.status_code}")
    if response.status_code >= 400:
        raise FinalBackendError(f"rejected the request (HTTP {response.status_code}: {_refusal_detail(response)})",
                                request_refused=response.status_code in _REQUEST_REFUSED)
    try:
        return response.json()
    except ValueError:
        raise FinalBackendError(f"sent a response that is not JSON (HTTP {response.status_code})") from None

"""Shared by the project's HTTP servers (retrieval, the OpenAI-compatible model server): one-line 4xx
refusals, a capped JSON body reader, a listening socket, and the address file a launcher polls."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from rlinf_search.net.header_timeout import HEADER_TIMEOUT_S, header_timeout_protocol

log = logging.getLogger(__name__)


class ClientError(Exception):
    """A request the server understood and refuses; becomes a 4xx with ``message``."""

    def __init__(self, status: int, message: str, *, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        """The request field at fault, when one is (OpenAI's error body names it)."""


def _error_field(exc: ValidationError) -> str:
    return ".".join(str(p) for p in exc.errors()[0].get("loc", ())) or "body"


def validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"invalid request field '{_error_field(exc)}': {first.get('msg', 'invalid value')}"


class ClientGone(Exception):
    """The client closed the connection before its request was read: nobody to answer, and not the server's fault
    (counted apart from errors, never logged with a traceback)."""


# A body that trickles in slower than this is dropped (408), so a slow client cannot hold a connection forever.
BODY_TIMEOUT_S = 30.0
# A \uD800-\uDFFF escape in the raw body: the only way a lone surrogate gets into a decoded string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


async def read_body(request: Request, model: type[BaseModel], max_bytes: int, *,
                    timeout_s: float = BODY_TIMEOUT_S) -> BaseModel:
    """Parse the body as JSON whatever its content type (curl -d sends form-encoded), within a size cap and a time
    limit. Whatever the bytes, the outcome is the model, a ``ClientError`` (4xx) or ``ClientGone``."""
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise ClientError(413, f"request body exceeds the limit of {max_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise ClientError(408, f"request body not received within {timeout_s:g} s") from None
    except ClientDisconnect:
        raise ClientGone() from None
    raw = b"".join(chunks)
    try:
        payload = json.loads(raw)
    except RecursionError:
        raise ClientError(400, "request body is nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer past Python's digit limit
        reason = "" if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) else f" ({exc})"
        raise ClientError(400, f"request body is not valid JSON{reason}") from None
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(payload):
        raise ClientError(400, "request body holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape); "
                               "send valid Unicode")
    if not isinstance(payload, dict):
        raise ClientError(400, f"request body must be a JSON object, got {type(payload).__name__}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ClientError(400, validation_message(exc), param=_error_field(exc)) from None


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it Nagle plus delayed ACK hold every keep-alive response
    # (uvicorn writes headers and body separately) for 40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def write_address(path: str, address: str) -> None:
    # Written only once the socket listens, and atomically, so a launcher polling the file can connect.
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(address + "\n")
    os.replace(tmp, target)


def socket_address(sock: socket.socket) -> str:
    """``host:port`` (``[host]:port`` for IPv6) a client connects to."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve_forever(app: FastAPI, sock: socket.socket, *, on_started: Callable[[str], None],
                  address_file: str | None = None, header_timeout_s: float = HEADER_TIMEOUT_S) -> None:
    """Serve ``app`` on the listening ``sock`` until stopped; once it accepts connections, call
    ``on_started(address)`` and write the address to ``address_file`` (for a launcher to poll). A client whose
    request headers are not complete ``header_timeout_s`` after it connected (or began the request) gets 408."""
    address = socket_address(sock)
    protocol = header_timeout_protocol(header_timeout_s)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           **({"http": protocol} if protocol is not None else {})))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            on_started(address)
            if address_file:
                write_address(address_file, address)
        await task

    with asyncio.Runner(loop_factory=_fast_loop_factory()) as runner:
        runner.run(serve())


def _fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency on Linux and macOS), else asyncio's own. With uvloop
    and httptools (which uvicorn picks by itself) the retrieval server's HTTP work per request roughly halves, and
    that work shares the cores with the encoder (docs/history/benchmarks.md, section 1)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop

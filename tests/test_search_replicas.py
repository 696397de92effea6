"""Retrieval replicas behind one search client (``tools.search.server_addr`` as a list): real servers on loopback,
one killed while queries are in flight, then restarted on its port and admitted again."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.tools.search.replicas import ReplicaSet
from tests.conftest import HOTPOT_DIR


def _questions(n: int) -> list[str]:
    rows = [json.loads(line) for line in (HOTPOT_DIR / "test.jsonl").read_text().splitlines()]
    return [row["question"] for row in rows[:n]]


def _server_args(index_dir, corpus, *extra: str) -> list[str]:
    return ["--index-dir", str(index_dir), "--corpus", str(corpus), "--retriever", "bm25", *extra]


def _config(addrs: list[str], **changes) -> SearchToolConfig:
    # No cache and no coalescing: every query is a request of its own, so the load really spreads. No retries: a
    # query saved at all was saved by the move to the other replica inside its one attempt.
    settings = dict(server_addr=addrs, cache_size=0, max_batch=1, max_concurrency=8, timeout_s=5.0, deadline_s=20.0,
                    max_retries=0)
    return SearchToolConfig(**{**settings, **changes})


def test_a_replica_killed_mid_batch_loses_no_query_and_is_admitted_again_once_back(hotpot_index_dir, hotpot_corpus):
    questions = _questions(120)
    first, second = RetrievalServerProcess(_server_args(hotpot_index_dir, hotpot_corpus)), None
    with first, RetrievalServerProcess(_server_args(hotpot_index_dir, hotpot_corpus)) as other:
        addrs = [first.address, other.address]

        async def batch_with_kill():
            tool = build_search_tool(_config(addrs, replica_probe_interval_s=0.2))
            calls = [asyncio.ensure_future(tool.search(q)) for q in questions]
            while tool.metrics.calls < len(questions) // 3:  # a third answered, the rest in flight or queued
                await asyncio.sleep(0.005)
            first.kill()
            outcomes = await asyncio.gather(*calls)
            during = tool.backend.replica_metrics()
            # Back on the same port: the health probe admits it, and requests reach it again.
            nonlocal second
            port = first.address.rpartition(":")[2]
            second = RetrievalServerProcess(_server_args(hotpot_index_dir, hotpot_corpus, "--port", port)).start()
            for _ in range(100):
                await asyncio.sleep(0.1)
                await tool.search(questions[0])
                if tool.backend.replica_metrics()[addrs[0]]["admitted"]:
                    break
            before = tool.backend.replica_metrics()[addrs[0]]["requests"]
            later = await asyncio.gather(*(tool.search(q) for q in questions[:40]))
            after = tool.backend.replica_metrics()
            await tool.aclose()
            return outcomes, during, later, before, after

        try:
            outcomes, during, later, before, after = asyncio.run(batch_with_kill())
        finally:
            if second is not None:
                second.stop()
    assert len(outcomes) == len(questions)
    assert [o.error for o in outcomes if o.error] == [], "no query is lost when one replica dies"
    assert all(o.hits for o in outcomes)
    killed, survivor = during[addrs[0]], during[addrs[1]]
    assert killed["failures"] >= 2 and killed["ejections"] == 1 and killed["admitted"] == 0
    assert survivor["failures"] == 0 and survivor["requests"] > killed["requests"] - killed["failures"]
    assert all(o.error is None for o in later)
    assert after[addrs[0]]["admitted"] == 1 and after[addrs[0]]["requests"] > before, "admitted again, and used"


def test_a_hung_replica_costs_each_request_its_time_limit_once_then_is_set_aside(hotpot_index_dir, hotpot_corpus):
    """A replica that accepts connections and never answers (stopped, as a wedged process is): each request waiting on
    it moves to the other after ``timeout_s``, inside its one attempt, and after two such failures it gets no more."""
    questions = _questions(12)
    with RetrievalServerProcess(_server_args(hotpot_index_dir, hotpot_corpus)) as hung, \
            RetrievalServerProcess(_server_args(hotpot_index_dir, hotpot_corpus)) as other:
        addrs = [hung.address, other.address]

        async def batch():
            tool = build_search_tool(_config(addrs, timeout_s=1.0, deadline_s=10.0, max_concurrency=2))
            outcomes = [await tool.search(q) for q in questions]  # one at a time: the routing is predictable
            metrics = tool.backend.replica_metrics()
            await tool.aclose()
            return outcomes, metrics

        os.killpg(hung.process.pid, signal.SIGSTOP)
        try:
            outcomes, metrics = asyncio.run(batch())
        finally:
            os.killpg(hung.process.pid, signal.SIGCONT)
    assert [o.error for o in outcomes] == [None] * len(questions)
    assert metrics[addrs[0]]["failures"] == metrics[addrs[0]]["requests"] == 2, "two time limits, then set aside"
    assert metrics[addrs[0]]["admitted"] == 0 and metrics[addrs[1]]["requests"] == len(questions)
    slow = [o.latency_s for o in outcomes if o.latency_s > 0.9]
    assert len(slow) == 2, "only the two requests that waited on the hung replica paid its time limit"


def test_requests_go_to_the_replica_with_fewest_in_flight_and_move_on_when_one_fails():
    """The routing rules on their own: least in flight first, ties rotated, an ejected replica skipped while
    another is admitted, tried when every admitted one has failed the request, and a lone server never ejected."""

    async def check():
        async def never_healthy(addr: str) -> bool:
            return False

        replicas = ReplicaSet(("a:1", "b:2", "c:3"), eject_after=2, probe_interval_s=60.0, probe=never_healthy)
        a, b, c = replicas.replicas
        assert {replicas.choose(set()).addr for _ in range(6)} == {"a:1", "b:2", "c:3"}, "idle ties rotate"
        a.in_flight, b.in_flight, c.in_flight = 3, 1, 2
        assert replicas.choose(set()) is b
        assert replicas.choose({"b:2"}) is c
        replicas.failed(b, "ConnectError")
        assert b.admitted, "one failure is not enough to eject"
        replicas.failed(b, "ConnectError")
        assert not b.admitted and b.ejections == 1
        assert replicas.choose(set()) is c, "an ejected replica is skipped while others are admitted"
        assert replicas.choose({"a:1", "c:3"}) is b, "every admitted replica failed this request: try the ejected"
        assert replicas.choose({"a:1", "b:2", "c:3"}) is None
        replicas.answered(b)
        assert b.admitted, "an answer admits it again"
        assert replicas.snapshot()["b:2"] == {"in_flight": 1, "requests": 0, "failures": 2, "ejections": 1,
                                              "admitted": 1}

        lone = ReplicaSet(("only:1",), eject_after=1, probe_interval_s=60.0, probe=never_healthy)
        for _ in range(3):
            lone.failed(lone.replicas[0], "ConnectError")
        assert lone.replicas[0].admitted, "with nothing to move to, a lone server is never set aside"
        await replicas.aclose()

    asyncio.run(check())


@pytest.mark.parametrize("bad, message", [
    ([], "is an empty list"),
    (["127.0.0.1:8000", "nohost"], "must be 'host:port' or a list of them, got 'nohost'"),
    (["127.0.0.1:8000", "127.0.0.1:8000"], "lists a replica twice"),
])
def test_a_bad_replica_list_is_one_line_naming_the_key(bad, message):
    with pytest.raises(ValueError, match=message) as caught:
        SearchToolConfig.from_dict({"server_addr": bad})
    assert str(caught.value).startswith("tools.search.server_addr")
    with pytest.raises(ValueError, match="tools.search.replica_eject_after must be >= 1, got 0"):
        SearchToolConfig.from_dict({"server_addr": ["127.0.0.1:8000"], "replica_eject_after": 0})
    assert SearchToolConfig.from_dict({"server_addr": ["127.0.0.1:8001", "127.0.0.1:8002"]}).server_addrs == (
        "127.0.0.1:8001", "127.0.0.1:8002")

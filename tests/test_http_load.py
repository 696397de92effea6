"""The retrieval benchmark's load generator against a real retrieval server on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks.http_load import drive_load

QUESTIONS = Path(__file__).resolve().parent / "data" / "hotpotqa_100" / "test.jsonl"


@pytest.mark.parametrize("client", ["raw", "httpx"])
def test_each_client_completes_requests_and_counts_refusals(hotpot_server, client):
    """Four clients for a second: every request answered 200 with no error; a topk the server refuses (400) is
    counted as an error on every request, and the keep-alive connection goes on serving."""
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    latencies, errors, wall = asyncio.run(drive_load(hotpot_server.url, questions, clients=4, seconds=1.0, topk=3,
                                                     seed=0, client=client))
    assert errors == 0 and len(latencies) >= 4 and all(0 < latency < wall for latency in latencies)
    latencies, errors, _ = asyncio.run(drive_load(hotpot_server.url, questions, clients=2, seconds=0.5, topk=0,
                                                  seed=0, client=client))
    assert not latencies and errors >= 2
    with pytest.raises(ValueError, match="unknown client 'curl'"):
        asyncio.run(drive_load(hotpot_server.url, questions, clients=1, seconds=0.1, topk=3, seed=0, client="curl"))

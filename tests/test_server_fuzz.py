"""No client input gets a 5xx, on either server: request bodies generated from the request models (hypothesis) and
the hostile inputs found by hand, sent over real sockets to a real retrieval server and a real completions server
(``python -m rlinf_search.serve``) on loopback; each keeps serving and counts no server error."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinf_search.retrieval.launch import RetrievalServerProcess
from tests.test_teacher_server import teacher as completions  # noqa: F401 - the served tiny model, a fixture

# Any JSON value, small: what a confused client might put in any field.
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)
# Text with lone surrogates mixed in: JSON can carry them (as \ud800), UTF-8 cannot.
TEXT = st.text(st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)), max_size=40)
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                derandomize=True)


def _field(strategy):
    """A field as the model declares it, or anything else."""
    return st.one_of(strategy, JSON)


RETRIEVE = st.fixed_dictionaries(
    {}, optional={"queries": _field(st.lists(TEXT, max_size=6)), "topk": _field(st.integers(-10, 10**20)),
                  "return_scores": _field(st.booleans()), "other": JSON})
COMPLETION = st.fixed_dictionaries(
    {}, optional={"model": _field(st.sampled_from(["teacher", "other", ""])),
                  "prompt": _field(st.one_of(TEXT, st.lists(st.integers(-5, 10**6), max_size=6))),
                  "max_tokens": _field(st.integers(-3, 3)), "temperature": _field(st.floats(allow_nan=True)),
                  "echo": _field(st.booleans()), "logprobs": _field(st.integers(-2, 30)),
                  "seed": _field(st.integers(-(2**70), 2**70)), "return_tokens_as_token_ids": _field(st.booleans())})

# Found by hand (issue 54): each was a 500 before.
HOSTILE = [
    b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}",  # past Python's 4,300-digit int limit
    b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deeper than the JSON parser recurses
    b'{"queries": ["\\ud800"]}',  # a lone surrogate
    b"\xff\xfe{}",  # not UTF-8
]


def _send(client: httpx.Client, url: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()  # ensure_ascii escapes surrogates
    return client.post(url, content=content, headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def retrieval(hotpot_index_dir, hotpot_corpus):
    args = ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25",
            "--body-timeout-s", "1", "--header-timeout-s", "1"]
    with RetrievalServerProcess(args) as running:
        yield running


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as http:
        yield http


@FUZZ
@given(body=st.one_of(RETRIEVE, JSON, st.binary(max_size=40)))
def test_the_retrieval_server_answers_any_body_below_500(retrieval, client, body):
    response = _send(client, f"{retrieval.url}/retrieve", body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert "\n" not in response.json()["error"]


@FUZZ
@given(body=st.one_of(COMPLETION, JSON))
def test_the_completions_server_answers_any_body_below_500(completions, client, body):
    response = _send(client, f"http://{completions}/v1/completions", body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert "\n" not in response.json()["error"]["message"]


@pytest.mark.parametrize("raw", HOSTILE, ids=["5000-digit-topk", "100k-deep", "lone-surrogate", "not-utf8"])
def test_hostile_bodies_get_400_on_both_servers(retrieval, completions, client, raw):
    assert _send(client, f"{retrieval.url}/retrieve", raw).status_code == 400
    assert _send(client, f"http://{completions}/v1/completions", raw.replace(b"queries", b"prompt")).status_code == 400


def test_sampling_edge_values_are_answered(completions, client):
    url = f"http://{completions}/v1/completions"
    tiny_temperature = _send(client, url, {"model": "teacher", "prompt": "hello", "max_tokens": 2,
                                           "temperature": 1e-300})
    assert tiny_temperature.status_code == 200, tiny_temperature.text  # greedy, as vLLM below 1e-5
    huge_seed = _send(client, url, {"model": "teacher", "prompt": "hello", "max_tokens": 1, "seed": 2**70})
    assert huge_seed.status_code == 400 and "seed" in huge_seed.json()["error"]["message"]
    surrogate = _send(client, url, {"model": "teacher", "prompt": "hi \ud800", "max_tokens": 1})
    assert surrogate.status_code == 400 and "surrogate" in surrogate.json()["error"]["message"]
    # A 15 MB prompt cannot fit the model: refused before tokenizing (which took 23 s on the event loop).
    started = time.perf_counter()
    huge = _send(client, url, {"model": "teacher", "prompt": "word " * 3_000_000, "max_tokens": 1})
    assert huge.status_code == 400 and "cannot fit" in huge.json()["error"]["message"], huge.text
    assert time.perf_counter() - started < 5


def _metrics(retrieval) -> dict:
    return httpx.get(f"{retrieval.url}/metrics").json()


def test_a_response_too_large_is_refused_at_once_and_health_stays_quick(retrieval, client):
    """1,024 queries at topk 100 made 28.8 MB and held ``/health`` 2.5 s: now a 413 before any search."""
    started = time.perf_counter()
    response = _send(client, f"{retrieval.url}/retrieve", {"queries": ["lilu demon"] * 1024, "topk": 100})
    assert response.status_code == 413 and "the limit is 8192" in response.json()["error"], response.text
    assert time.perf_counter() - started < 2.0
    # The largest allowed response (8,192 passages) is formatted off the event loop: /health answers meanwhile.
    latencies = []

    def probe():
        for _ in range(10):
            t0 = time.perf_counter()
            assert httpx.get(f"{retrieval.url}/health").status_code == 200
            latencies.append(time.perf_counter() - t0)

    thread = threading.Thread(target=probe)
    thread.start()
    big = _send(client, f"{retrieval.url}/retrieve", {"queries": [f"query {i}" for i in range(1024)], "topk": 8})
    thread.join()
    assert big.status_code == 200 and len(big.json()["result"]) == 1024
    assert max(latencies) < 1.0, latencies


def _raw_request(address: str, head: bytes, body_part: bytes, *, then_wait_s: float = 0.0) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body_part)
        if then_wait_s:
            sock.settimeout(then_wait_s + 5)
            return sock.recv(4096)
    return b""


def test_a_client_gone_mid_body_is_no_server_error_and_a_slow_body_is_dropped(retrieval):
    head = (f"POST /retrieve HTTP/1.1\r\nHost: {retrieval.address}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n").encode()
    before = _metrics(retrieval)
    _raw_request(retrieval.address, head, b'{"queries": ["lil')  # then the socket closes
    deadline = time.monotonic() + 5
    while _metrics(retrieval)["client_disconnects"] == before["client_disconnects"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = _metrics(retrieval)
    assert after["client_disconnects"] == before["client_disconnects"] + 1
    assert after["server_errors"] == 0
    # A body that stops arriving: 408 after the server's body time limit (1 s here), the connection freed.
    started = time.monotonic()
    answer = _raw_request(retrieval.address, head, b'{"queries": ["lil', then_wait_s=1.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 5
    assert _metrics(retrieval)["server_errors"] == 0


def test_a_client_slow_with_its_headers_gets_408_and_the_server_goes_on(retrieval, client):
    """A connection that sends nothing, one that sends its headers a few bytes a time (a slow-loris client) and a
    keep-alive connection whose second request stops mid-headers: each gets 408 once the header time limit (1 s
    here) has passed, and its connection is closed; the server answers the next client at once."""
    host, port = retrieval.address.rsplit(":", 1)
    cases = {"silent": [], "slow-loris": [b"GET /hea", b"lth HTTP/1.1\r\n", b"Host: x\r\n"],
             "keep-alive": [b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /health HTTP/1.1\r\nHo"]}
    for name, parts in cases.items():
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            for part in parts:
                sock.sendall(part)
                time.sleep(0.3)
            received = b""
            while chunk := sock.recv(4096):  # until the server closes the connection
                received += chunk
        assert time.monotonic() - started < 5, name
        answers = received.split(b"HTTP/1.1 ")[1:]
        assert answers[-1].startswith(b"408 Request Timeout"), (name, received[-300:])
        assert b"request headers not received within 1 s" in answers[-1]
        if name == "keep-alive":
            assert answers[0].startswith(b"200"), received[:300]
    assert client.get(f"http://{retrieval.address}/health").status_code == 200
    assert _metrics(retrieval)["server_errors"] == 0

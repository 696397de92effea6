"""``python -m rlinf_search.serve`` as people use it: OpenAI's own Python client (PyPI ``openai``) against the real
server on loopback over the tiny model, with an API key. Chat through the model's template, ``n``, ``stop``,
``stream``, ``logprobs``, refusals naming their field in OpenAI's error body, the key never logged, and a
generation that stops when its client leaves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from rlinf_search.retrieval.launch import wait_for_address_file

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-serve-test-never-logged-7f3a"


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """The server with its key from the environment; yields (address, log file)."""
    folder = tmp_path_factory.mktemp("serve")
    log_path = folder / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "rlinf_search.serve", "--model", str(tiny_model_dir),
                                    "--port", "0", "--served-model-name", "tiny", "--save-address-to",
                                    str(folder / "addr")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "RLINF_SERVE_API_KEY": KEY})
    try:
        yield wait_for_address_file(folder / "addr", 120), log_path
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=f"http://{served[0]}/v1", api_key=KEY, max_retries=0, timeout=60) as api:
        yield api


MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Who wrote Hamlet?"}]


def test_chat_goes_through_the_template_with_n_seed_and_logprobs(client):
    answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, n=2, seed=7,
                                            temperature=1.0, logprobs=True, top_logprobs=3)
    assert answer.object == "chat.completion" and len(answer.choices) == 2
    assert [c.index for c in answer.choices] == [0, 1]
    for choice in answer.choices:
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")
        entries = choice.logprobs.content
        assert entries and all(e.logprob <= 0 and len(e.top_logprobs) == 3 for e in entries)
        assert all(e.top_logprobs[0].logprob >= e.logprob for e in entries)
    assert answer.usage.completion_tokens == sum(len(c.logprobs.content) for c in answer.choices)
    # The prompt is the template's rendering: more tokens than the user's words alone.
    assert answer.usage.prompt_tokens > 8
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, n=2, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in answer.choices], "seeded"


def test_streamed_chat_equals_the_whole_answer_and_reports_usage(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, temperature=0,
                                           extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_a_stop_string_cuts_the_text_before_it_in_both_endpoints(client):
    full = client.completions.create(model="tiny", prompt="The city of", max_tokens=30, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[6:9]
    assert len(stop) == 3 and stop.strip(), full
    cut = full[:full.index(stop)]
    stopped = client.completions.create(model="tiny", prompt="The city of", max_tokens=30, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.text == cut and stopped.finish_reason == "stop"
    streamed = client.completions.create(model="tiny", prompt="The city of", max_tokens=30, temperature=0,
                                         stop=stop, stream=True, n=2, extra_body={"ignore_eos": True})
    texts, reasons = {0: "", 1: ""}, {}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert texts == {0: cut, 1: cut} and reasons == {0: "stop", 1: "stop"}


def test_what_cannot_be_honoured_is_a_400_naming_the_field(client):
    cases = [(dict(best_of=3), "best_of"), (dict(presence_penalty=0.5), "presence_penalty"),
             (dict(logit_bias={"5": 10}), "logit_bias"), (dict(top_p=0.5), "top_p"),
             (dict(logprobs=2, stream=True), "stream"), (dict(n=17), "n")]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="tiny", prompt="hi", max_tokens=2, **fields)
        assert caught.value.status_code == 400 and caught.value.body["param"] == param, (fields, caught.value.body)
        assert caught.value.body["type"] == "invalid_request_error" and "\n" not in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert caught.value.body["param"] == "tools"
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert caught.value.body["code"] == "model_not_found"


def test_the_api_key_is_required_and_never_logged(served, client):
    address, log_path = served
    for key in ("sk-wrong", ""):
        with openai.OpenAI(base_url=f"http://{address}/v1", api_key=key or "unset", max_retries=0) as other:
            with pytest.raises(openai.AuthenticationError) as caught:
                other.models.list()
            assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
    assert httpx.post(f"http://{address}/v1/completions", json={"model": "tiny", "prompt": "hi"}).status_code == 401
    assert httpx.get(f"http://{address}/health").status_code == 200, "probes need no key"
    assert [m.id for m in client.models.list().data] == ["tiny"]
    log = log_path.read_text()
    assert "API key required" in log and KEY not in log and "sk-wrong" not in log


def _one_token_seconds(client) -> float:
    started = time.perf_counter()
    client.completions.create(model="tiny", prompt="hi", max_tokens=1)
    return time.perf_counter() - started


def test_a_client_that_leaves_stops_its_generation(served, client):
    """3,000 tokens take seconds on the tiny model. A client that gives up after 0.3 s (whole answer or stream) frees
    the model at once: the next 1-token request is not kept waiting for tokens nobody reads."""
    address, _ = served
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    started = time.perf_counter()
    assert httpx.post(f"http://{address}/v1/completions", json=body, headers=headers, timeout=120).status_code == 200
    full = time.perf_counter() - started
    assert full > 2.0, f"the long generation took {full:.2f} s: too short to tell"

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"http://{address}/v1/completions", json=body, headers=headers, timeout=httpx.Timeout(60, read=0.3))
    after_whole = _one_token_seconds(client)

    with httpx.stream("POST", f"http://{address}/v1/completions", json={**body, "stream": True}, headers=headers,
                      timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    after_stream = _one_token_seconds(client)
    assert after_whole < full / 3 and after_stream < full / 3, (full, after_whole, after_stream)

    # And /health answers while a generation runs.
    worker = threading.Thread(target=lambda: httpx.post(f"http://{address}/v1/completions", json=body,
                                                        headers=headers, timeout=120))
    worker.start()
    time.sleep(0.3)
    probe = time.perf_counter()
    assert httpx.get(f"http://{address}/health").status_code == 200
    assert time.perf_counter() - probe < 0.5
    worker.join()

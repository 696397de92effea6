"""The teacher client against real HTTP servers on loopback: the deadline starts when a request holds its
concurrency slot, no proxy from the environment, every malformed answer a counted failure, and the
teacher's start script keeps the API key off the command line."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlinf_search.distill.config import TeacherConfig
from rlinf_search.distill.teacher import TeacherClient, TeacherFailed

ROOT = Path(__file__).resolve().parents[1]


def _completion(ids: list[int], top: bool = False) -> dict:
    logprobs = {"token_logprobs": [None] + [-1.0] * (len(ids) - 1)}
    if top:
        logprobs["top_logprobs"] = [None] + [{"token_id:3": -0.5}] * (len(ids) - 1)
    return {"choices": [{"logprobs": logprobs}]}


class _Teacher:
    """An OpenAI-style completions endpoint that answers after ``delay_s`` with ``answer(request)``."""

    def __init__(self, answer, delay_s: float = 0.0):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(delay_s)
                payload = json.dumps(answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                outer.requests += 1

            def log_message(self, *args):
                pass

        self.requests = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


async def _score_all(config: TeacherConfig, prompts: list, top_k: int = 0) -> list:
    client = TeacherClient(config, temperature=1.0)
    try:
        return await asyncio.gather(*(client.score(p, top_k=top_k) for p in prompts), return_exceptions=True)
    finally:
        await client.aclose()


def test_the_deadline_counts_from_the_slot_not_from_the_queue():
    """One slot, answers in 0.3 s, a 0.5 s deadline: the fifth of five requests waits 1.2 s for its slot and
    still gets its answer (the old deadline, counted from the call, failed requests 2 to 5)."""
    teacher = _Teacher(lambda body: _completion(body["prompt"]), delay_s=0.3)
    try:
        config = TeacherConfig(base_url=teacher.base_url, model="t", max_concurrency=1, deadline_s=0.5,
                               timeout_s=0.45, max_retries=0)
        answers = asyncio.run(_score_all(config, [[1, 2, 3]] * 5))
    finally:
        teacher.close()
    assert all(not isinstance(a, Exception) for a in answers), answers
    assert teacher.requests == 5


def test_the_environments_proxy_is_not_used_unless_configured(monkeypatch):
    """A proxy set for the internet (here: nothing listens there) would see the bearer token and every
    trajectory; the teacher's requests go direct, and through ``teacher.proxy`` only when it is set."""
    teacher = _Teacher(lambda body: _completion(body["prompt"]))
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        direct = TeacherConfig(base_url=teacher.base_url, model="t", max_retries=0, timeout_s=2.0)
        [answer] = asyncio.run(_score_all(direct, [[1, 2]]))
        assert not isinstance(answer, Exception), answer
        proxied = TeacherConfig(base_url=teacher.base_url, model="t", max_retries=0, timeout_s=2.0,
                                proxy="http://127.0.0.1:9")
        [failed] = asyncio.run(_score_all(proxied, [[1, 2]]))
        assert isinstance(failed, TeacherFailed)
    finally:
        teacher.close()
    with pytest.raises(ValueError, match="algorithm.distill.teacher.proxy"):
        TeacherConfig(model="t", proxy="127.0.0.1:3128")


MALFORMED = {
    "logprob is text": lambda ids: {"choices": [{"logprobs": {"token_logprobs": [None] + ["-1.0"] * (len(ids) - 1)}}]},
    "too few log-probs": lambda ids: _completion(ids[:-1]),
    "no choices": lambda ids: {"choices": []},
    "logprobs is a list": lambda ids: {"choices": [{"logprobs": []}]},
    "null top value": lambda ids: {"choices": [{"logprobs": {"token_logprobs": [None] + [-1.0] * (len(ids) - 1),
                                                             "top_logprobs": [None] + [{"token_id:3": None}] * (len(ids) - 1)}}]},
    "top entry is a list": lambda ids: {"choices": [{"logprobs": {"token_logprobs": [None] + [-1.0] * (len(ids) - 1),
                                                                  "top_logprobs": [None] + [[3]] * (len(ids) - 1)}}]},
    "short top": lambda ids: {"choices": [{"logprobs": {"token_logprobs": [None] + [-1.0] * (len(ids) - 1),
                                                        "top_logprobs": [None]}}]},
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_answer_is_a_teacher_failure_not_a_crash(case):
    teacher = _Teacher(lambda body: MALFORMED[case](body["prompt"]))
    try:
        config = TeacherConfig(base_url=teacher.base_url, model="t", max_retries=0, timeout_s=2.0)
        [answer] = asyncio.run(_score_all(config, [[1, 2, 3]], top_k=2))
    finally:
        teacher.close()
    assert isinstance(answer, TeacherFailed), answer
    assert "\n" not in str(answer) and teacher.base_url in str(answer)


def test_the_start_script_gives_vllm_the_key_in_its_environment_not_its_command_line(tmp_path):
    """A ``vllm`` on PATH that records what it was given and answers /health as ``vllm serve`` does."""
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"""#!/usr/bin/env bash
printf '%s\\n' "$@" > {tmp_path}/argv
printf '%s' "${{VLLM_API_KEY:-}}" > {tmp_path}/key
port=$(printf '%s\\n' "$@" | grep -A1 -x -- --port | tail -1)
exec python3 -c '
import sys, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$port"
""")
    fake.chmod(0o755)
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    secret = "sk-teacher-secret-123"
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "TEACHER_API_KEY": secret,
           "TEACHER_LOG": str(tmp_path / "teacher.log")}
    result = subprocess.run(["bash", str(ROOT / "examples/searchr1/start_teacher_server.sh"), str(tmp_path / "m"),
                             str(port)], env=env, capture_output=True, text=True, timeout=60, check=False)
    try:
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "key").read_text() == secret
        argv = (tmp_path / "argv").read_text()
        assert secret not in argv and "--api-key" not in argv and "--port" in argv
        assert secret not in result.stdout + result.stderr
    finally:
        pid = re.search(r"\(pid (\d+),", result.stdout)
        if pid:  # the script leaves the server running, as it should: stop the stand-in
            os.kill(int(pid.group(1)), signal.SIGTERM)

"""``TeacherClient``: the log-prob a teacher model gives each token of a text, from any OpenAI-compatible
completions server (``vllm serve``, SGLang, ``python -m rlinf_search.serve``).

One request per trajectory: the prompt and response go as the ``prompt`` (token ids when the teacher
shares the student's tokenizer, else text), with ``echo: true, logprobs: 0, max_tokens: 1``; the echoed
``token_logprobs`` are the teacher's log-probs of the given tokens. With ``top_k`` > 0 (ids only) the
request asks for ``logprobs: top_k`` and vLLM's ``return_tokens_as_token_ids``, and each position's
``top_logprobs`` come back as (id, log-prob) pairs. The call runs through the shared
``RetryingCaller`` (retries, deadline, concurrency cap, rate limit); a failure is a ``TeacherFailed``
with one line that never holds the API key.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from rlinf_search.distill.config import TeacherConfig
from rlinf_search.net.http import FinalBackendError, make_http_client, post_json
from rlinf_search.net.retry import CallFailed, RetryingCaller


class TeacherFailed(Exception):
    """The teacher gave no usable answer for one request (after retries, or past the deadline)."""


@dataclass
class TeacherTokens:
    """The teacher's tokens of the text it was sent, each with its log-prob and place in the text."""

    logprobs: list[float | None]
    """Log-prob of each token given the ones before; None where the server gives none (the first)."""
    offsets: list[int]
    """Character offset of each token in the text (``text_offset``); empty when ids were sent."""
    top: list[list[tuple[int, float]]] | None
    """Per token, the teacher's ``top_k`` most likely (id, log-prob) at its position, most likely first
    (empty for the first token); None when not asked for."""
    latency_s: float
    """Wall time of the call, retries included."""


class TeacherClient:
    """Scores token sequences with the teacher; one client belongs to one event loop."""

    def __init__(self, config: TeacherConfig, *, temperature: float):
        self.config = config
        self.temperature = temperature
        self.url = config.base_url.rstrip("/") + "/completions"
        key = os.environ.get(config.api_key_env)
        self._headers = {"Authorization": f"Bearer {key}"} if key else None
        self._http = make_http_client(config.max_concurrency, trust_env=True)
        self._caller = RetryingCaller(config.retry_policy)

    async def score(self, prompt: list[int] | str, *, top_k: int = 0) -> TeacherTokens:
        """The teacher's log-prob of every token of ``prompt`` (ids, or text it tokenizes itself), and with
        ``top_k`` > 0 (ids only) its ``top_k`` most likely tokens at every position."""
        if top_k and not isinstance(prompt, list):
            raise ValueError("top_k needs the prompt as token ids (a teacher that shares the student's tokenizer)")
        loop = asyncio.get_running_loop()
        started = loop.time()
        body = {"model": self.config.model, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": top_k,
                "temperature": self.temperature}
        if top_k:
            body["return_tokens_as_token_ids"] = True

        async def attempt() -> dict:
            return await post_json(self._http, self.url, body, timeout_s=self.config.timeout_s,
                                   headers=self._headers)

        try:
            answer = await self._caller.call(attempt, deadline=started + self.config.deadline_s)
            tokens = _echoed(answer, prompt, top_k)
        except CallFailed as failed:
            raise TeacherFailed(self._failure_message(failed)) from None
        except FinalBackendError as exc:
            raise TeacherFailed(f"teacher at {self.url} {exc.reason}") from None
        tokens.latency_s = loop.time() - started
        return tokens

    def _failure_message(self, failed: CallFailed) -> str:
        plural = "s" if failed.attempts > 1 else ""
        if failed.final is not None:
            return f"teacher at {self.url} {failed.final.reason}"
        last = f", last: {failed.last.what} ({failed.last.cause})" if failed.last else ""
        if failed.deadline_passed:
            return (f"teacher at {self.url} gave no answer within the {self.config.deadline_s:g} s deadline "
                    f"({failed.attempts} attempt{plural}{last})")
        return f"teacher at {self.url} {failed.last.what} after {failed.attempts} attempt{plural} ({failed.last.cause})"

    async def aclose(self) -> None:
        await self._http.aclose()


def _echoed(answer: dict, prompt: list[int] | str, top_k: int = 0) -> TeacherTokens:
    """The prompt's part of an echoed answer: the first ``len(prompt)`` tokens for ids, the tokens that
    start inside the text for text (the generated token starts at its end)."""
    try:
        logprobs = answer["choices"][0]["logprobs"]
        values, offsets = list(logprobs["token_logprobs"]), list(logprobs.get("text_offset") or [])
    except (KeyError, IndexError, TypeError):
        raise FinalBackendError("sent no echoed logprobs (choices[0].logprobs.token_logprobs); it must accept "
                                "echo with logprobs, as vLLM and SGLang do") from None
    if isinstance(prompt, list):
        if len(values) < len(prompt):
            raise FinalBackendError(f"echoed {len(values)} log-probs for a prompt of {len(prompt)} tokens")
        top = _top_ids(logprobs.get("top_logprobs"), len(prompt), top_k) if top_k else None
        return TeacherTokens(logprobs=values[: len(prompt)], offsets=[], top=top, latency_s=0.0)
    if len(offsets) != len(values):
        raise FinalBackendError("sent token_logprobs without a text_offset for each token")
    kept = sum(1 for offset in offsets if offset < len(prompt))
    return TeacherTokens(logprobs=values[:kept], offsets=offsets[:kept], top=None, latency_s=0.0)


def _top_ids(top: list | None, length: int, top_k: int) -> list[list[tuple[int, float]]]:
    """``top_logprobs`` keyed ``token_id:<id>`` as (id, log-prob) lists, the ``top_k`` most likely first (vLLM
    also lists the given token when it is not among them)."""
    if not isinstance(top, list) or len(top) < length:
        raise FinalBackendError("sent no top_logprobs for every prompt token; algorithm.distill.top_k needs a "
                                "server that returns them with echo (vLLM, python -m rlinf_search.serve)")
    out: list[list[tuple[int, float]]] = []
    for entries in top[:length]:
        if not entries:
            out.append([])
            continue
        try:
            pairs = [(int(key.removeprefix("token_id:")), float(value)) for key, value in entries.items()]
        except (AttributeError, ValueError):
            raise FinalBackendError("sent top_logprobs keyed by text, not token_id:<id>; it must accept "
                                    "return_tokens_as_token_ids, as vLLM does") from None
        out.append(sorted(pairs, key=lambda pair: -pair[1])[:top_k])
    return out

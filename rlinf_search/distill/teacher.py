"""``TeacherClient``: the log-prob a teacher model gives each token of a text, from any OpenAI-compatible
completions server (``vllm serve``, SGLang, ``python -m rlinf_search.serve``).

One request per trajectory: the prompt and response go as the ``prompt``, token ids of the teacher's
vocabulary (the student's own ids when they share a tokenizer; else the client tokenizes with the
teacher's tokenizer), with ``echo: true, logprobs: 0, max_tokens: 1``; the echoed ``token_logprobs`` are
the teacher's log-probs of the given tokens, and their count is checked (a server that added a token, a
BOS say, would shift every value). With ``top_k`` > 0 (ids only) the
request asks for ``logprobs: top_k`` and vLLM's ``return_tokens_as_token_ids``, and each position's
``top_logprobs`` come back as (id, log-prob) pairs. The call runs through the shared
``RetryingCaller`` (retries, deadline, concurrency cap, rate limit); a failure is a ``TeacherFailed``
with one line that never holds the API key.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from rlinf_search.distill.config import TeacherConfig
from rlinf_search.net.http import FinalBackendError, make_http_client, post_json
from rlinf_search.net.retry import CallFailed, RetryingCaller


T = TypeVar("T")


class TeacherFailed(Exception):
    """The teacher gave no usable answer for one request (after retries, or past the deadline)."""


@dataclass
class TopK:
    """The teacher's most likely tokens at each of n positions, most likely first."""

    ids: torch.Tensor
    """``[n, k]`` int64 token ids; 0 in a padding slot."""
    logprobs: torch.Tensor
    """``[n, k]`` float32 log-probs; -inf in a padding slot (a position with fewer than k, or none)."""

    @classmethod
    def empty(cls, n: int, k: int) -> TopK:
        return cls(ids=torch.zeros((n, k), dtype=torch.long), logprobs=torch.full((n, k), -math.inf))

    def __len__(self) -> int:
        return self.ids.shape[0]


@dataclass
class TeacherTokens:
    """The teacher's tokens of the text it was sent, each with its log-prob and place in the text."""

    logprobs: list[float | None]
    """Log-prob of each token given the ones before; None where the server gives none (the first)."""
    top: TopK | None
    """Per token, the teacher's ``top_k`` most likely tokens at its position (none for the first token);
    None when not asked for."""
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
        # No proxy from the environment: a proxy set for the internet would see the bearer token and every
        # trajectory's text; a teacher behind one names it (teacher.proxy).
        self._http = make_http_client(config.max_concurrency, trust_env=False, proxy=config.proxy)
        self._caller = RetryingCaller(config.retry_policy)

    async def score(self, prompt: list[int], *, top_k: int = 0) -> TeacherTokens:
        """The teacher's log-prob of every token of ``prompt`` (ids of its vocabulary), and with ``top_k`` > 0
        its ``top_k`` most likely tokens at every position."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        tokens = await self._echo(prompt, top_k=top_k, as_ids=top_k > 0,
                                  read=lambda answer: _echoed(answer, prompt, top_k))
        tokens.latency_s = loop.time() - started
        return tokens

    async def token_ids(self, text: str) -> list[int]:
        """The ids the teacher's own tokenizer gives ``text`` (echoed with ``return_tokens_as_token_ids``): the
        start-up check that a teacher set to share the student's tokenizer really does."""
        return await self._echo(text, top_k=0, as_ids=True, read=_echoed_ids)

    async def _echo(self, prompt: list[int] | str, *, top_k: int, as_ids: bool, read: Callable[[dict], T]) -> T:
        """One echoed completion of ``prompt`` (``max_tokens: 1``) through the retrying caller, read by ``read``;
        every failure, a malformed answer included, is a one-line ``TeacherFailed``."""
        body = {"model": self.config.model, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": top_k,
                "temperature": self.temperature}
        if as_ids:
            body["return_tokens_as_token_ids"] = True

        async def attempt() -> dict:
            return await post_json(self._http, self.url, body, timeout_s=self.config.timeout_s,
                                   headers=self._headers)

        try:
            return read(await self._caller.call(attempt, deadline_s=self.config.deadline_s))
        except CallFailed as failed:
            raise TeacherFailed(self._failure_message(failed)) from None
        except FinalBackendError as exc:
            raise TeacherFailed(f"teacher at {self.url} {exc.reason}") from None

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


def _echoed(answer: dict, prompt: list[int], top_k: int = 0) -> TeacherTokens:
    """The prompt's part of an echoed answer: its first ``len(prompt)`` tokens (then the one generated).
    Anything malformed is a ``FinalBackendError`` (the trajectory trains without the signal and counts as
    failed), never a crash."""
    try:
        logprobs = answer["choices"][0]["logprobs"]
        values = list(logprobs["token_logprobs"])
    except (KeyError, IndexError, TypeError, AttributeError):
        raise FinalBackendError("sent no echoed logprobs (choices[0].logprobs.token_logprobs); it must accept "
                                "echo with logprobs, as vLLM and SGLang do") from None
    if not all(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)) for value in values):
        raise FinalBackendError("sent a token_logprobs entry that is neither a number nor null")
    values = [None if value is None or math.isnan(value) else float(value) for value in values]
    if not len(prompt) <= len(values) <= len(prompt) + 1:
        raise FinalBackendError(f"echoed {len(values)} log-probs for a prompt of {len(prompt)} tokens and one "
                                f"generated (a server that adds a BOS to token prompts shifts every value)")
    top = _top_ids(logprobs.get("top_logprobs"), len(prompt), top_k) if top_k else None
    return TeacherTokens(logprobs=values[: len(prompt)], top=top, latency_s=0.0)


def _echoed_ids(answer: dict) -> list[int]:
    """The echoed prompt's ids from ``logprobs.tokens`` keyed ``token_id:<id>`` (the last token is the one
    generated)."""
    try:
        return [_token_id(token) for token in answer["choices"][0]["logprobs"]["tokens"][:-1]]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise FinalBackendError("sent no logprobs.tokens as token_id:<id>; it must accept "
                                "return_tokens_as_token_ids, as vLLM does") from None


def _top_ids(top: list | None, length: int, top_k: int) -> TopK:
    """``top_logprobs`` keyed ``token_id:<id>`` as ``[length, top_k]`` tensors, the most likely first (vLLM
    also lists the given token when it is not among them; only the ``top_k`` best are kept). A position the
    server left empty (the first) is padding."""
    if not isinstance(top, list) or len(top) < length:
        raise FinalBackendError("sent no top_logprobs for every prompt token; algorithm.distill.top_k needs a "
                                "server that returns them with echo (vLLM, python -m rlinf_search.serve)")
    # Flat lists filled in place, one tensor at the end: no per-position tensors or tuples kept. The order
    # within a position does not matter to the loss (a sum over the k), so only an extra entry (the given
    # token, which vLLM adds when it is not among the k) is dropped, the least likely one, without a sort.
    ids, values = [0] * (length * top_k), [-math.inf] * (length * top_k)
    for position, entries in enumerate(top[:length]):
        if not entries:
            continue
        if not isinstance(entries, dict):
            raise FinalBackendError(f"sent a top_logprobs entry that is not an object ({type(entries).__name__})")
        try:
            keys, logprobs = [_token_id(key) for key in entries], [float(value) for value in entries.values()]
        except (AttributeError, ValueError):
            raise FinalBackendError("sent top_logprobs keyed by text, not token_id:<id>; it must accept "
                                    "return_tokens_as_token_ids, as vLLM does") from None
        except TypeError:
            raise FinalBackendError("sent a top_logprobs value that is not a number") from None
        while len(keys) > top_k:
            drop = logprobs.index(min(logprobs))
            del keys[drop], logprobs[drop]
        at = position * top_k
        ids[at:at + len(keys)], values[at:at + len(keys)] = keys, logprobs
    return TopK(ids=torch.tensor(ids, dtype=torch.long).view(length, top_k),
                logprobs=torch.tensor(values, dtype=torch.float32).view(length, top_k))


def _token_id(key: str) -> int:
    """``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``) as the id; a text key is a ``ValueError``."""
    if not key.startswith("token_id:"):
        raise ValueError(key)
    return int(key[len("token_id:"):])

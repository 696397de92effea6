"""The completions endpoint's scoring path (``echo`` with ``logprobs``): what a distillation teacher is asked for.

Where the client reads a field it answers as vLLM does: log-probs are of the model's own distribution whatever
``temperature`` the request asks for (vLLM returns raw log-probs; the temperature only shapes sampling); each
position's ``top_logprobs`` also lists the token actually there when it is not among the k; with
``return_tokens_as_token_ids`` the ``tokens`` are ``token_id:<id>`` too.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from rlinf_search.serve.completion_model import CompletionModel
from rlinf_search.serve.requests import CompletionRequest


async def scored_choice(model: CompletionModel, executor: Executor, ids: list[int], new: list[int],
                        body: CompletionRequest) -> dict:
    """The one choice of a scoring request: ``new`` generated after the prompt ``ids``, with the log-probs asked."""
    loop = asyncio.get_running_loop()
    choice = {"index": 0, "text": model.tokenizer.decode(new),
              "finish_reason": "stop" if new and new[-1] in model.end_ids else "length", "logprobs": None}
    if body.logprobs is not None:
        scored_ids = (ids if body.echo else []) + new
        logprobs, top = await loop.run_in_executor(executor, lambda: model.score(
            ids + new, temperature=1.0, top_k=body.logprobs))
        start = 0 if body.echo else len(ids)
        described = model.describe(scored_ids, logprobs[start:])
        as_ids = body.return_tokens_as_token_ids
        tokens = [f"token_id:{token}" for token in scored_ids] if as_ids else described.tokens
        with_given = [None if entries is None else _with_given(entries, token, value)
                      for entries, token, value in zip(top[start:], scored_ids, logprobs[start:])]
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": described.logprobs,
                              "text_offset": described.offsets,
                              "top_logprobs": _top_logprobs(model, with_given, as_ids) if body.logprobs > 0 else None}
    if body.echo:
        choice["text"] = model.tokenizer.decode(ids) + choice["text"]
    return choice


def _with_given(entries: list[tuple[int, float]], token: int, value: float | None) -> list[tuple[int, float]]:
    """vLLM's top-k list at a position: the k most likely, and the token actually there when it is not
    among them (k + 1 entries then)."""
    if value is None or any(t == token for t, _ in entries):
        return entries
    return entries + [(token, value)]


def _top_logprobs(model: CompletionModel, top: list[list[tuple[int, float]] | None],
                  as_ids: bool) -> list[dict[str, float] | None]:
    """Per position, ``{token: log-prob}`` of the most likely tokens, keyed by text or ``token_id:<id>``."""
    def key(token: int) -> str:
        return f"token_id:{token}" if as_ids else model.tokenizer.decode([token])

    return [None if entries is None else {key(token): value for token, value in entries} for entries in top]

"""The OpenAI-compatible completions server: ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``.

It speaks the subset a distillation teacher needs, as vLLM and SGLang do: a prompt as text or token
ids, ``echo`` with ``logprobs`` (each prompt token's log-prob, ``text_offset`` into the text; with
``logprobs: k`` > 0 also each position's ``k`` most likely tokens, keyed by id with vLLM's
``return_tokens_as_token_ids``),
``max_tokens`` (0 scores only), ``temperature``. Bad requests get a one-line 4xx and the server keeps
serving.

Where the client reads a field it answers as vLLM does: log-probs are of the model's own distribution
whatever ``temperature`` the request asks for (vLLM returns raw log-probs; the temperature only shapes
sampling); each position's ``top_logprobs`` also lists the token actually there when it is not among the
k; with ``return_tokens_as_token_ids`` the ``tokens`` are ``token_id:<id>`` too. A text prompt is tokenized
with the tokenizer's special tokens (a BOS where the model has one), as vLLM does.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from rlinf_search.distill.config import MAX_TOP_K
from rlinf_search.net.serving import ClientError, ClientGone, read_body
from rlinf_search.serve.completion_model import CompletionModel

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
# A text prompt longer than this many characters per token of the model's context cannot fit: refused before it is
# tokenized (a 15 MB prompt took 23 s to tokenize).
_MAX_CHARS_PER_TOKEN = 64


class CompletionRequest(BaseModel):
    """Body of ``POST /v1/completions`` (fields this server does not use are ignored, as OpenAI's are)."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    prompt: StrictStr | list[StrictInt]
    max_tokens: StrictInt = Field(default=16, ge=0)
    temperature: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_K)
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # what a torch generator takes
    return_tokens_as_token_ids: StrictBool = False
    """vLLM's extension: ``top_logprobs`` keys are ``token_id:<id>`` instead of token text (text can be
    ambiguous; ids are what a same-tokenizer client needs)."""


def create_app(model: CompletionModel, *, served_name: str) -> FastAPI:
    """The app around a loaded model; requests run one at a time on a worker thread."""
    app = FastAPI(title="rlinf-search completions server")
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
    vocab = len(model.tokenizer)

    @app.exception_handler(ClientError)
    async def _client_error(_request: Request, exc: ClientError):
        return JSONResponse({"error": {"message": exc.message, "type": "invalid_request_error"}},
                            status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def _client_gone(_request: Request, _exc: ClientGone):
        return Response(status_code=499)  # never delivered: the connection is closed

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        log.exception("internal error")
        return JSONResponse({"error": {"message": f"internal error: {type(exc).__name__}"}}, status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "rlinf-search"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(request, CompletionRequest, MAX_BODY_BYTES)
        if body.model != served_name:
            raise ClientError(404, f"model {body.model!r} is not served here; this server serves {served_name!r}")
        if isinstance(body.prompt, str) and len(body.prompt) > model.max_length * _MAX_CHARS_PER_TOKEN:
            raise ClientError(400, f"prompt of {len(body.prompt)} characters cannot fit the model's "
                                   f"{model.max_length} tokens")
        # Tokenized on a thread of its own: a long prompt must not stop /health or other requests being read.
        ids = list(body.prompt) if isinstance(body.prompt, list) else await asyncio.to_thread(
            model.encode, body.prompt, special_tokens=True)
        if not ids:
            raise ClientError(400, "prompt is empty")
        if any(not 0 <= token < vocab for token in ids):
            raise ClientError(400, f"prompt holds a token id outside the vocabulary (0-{vocab - 1})")
        if len(ids) + body.max_tokens > model.max_length:
            raise ClientError(400, f"prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) exceed the "
                                   f"model's {model.max_length} tokens")
        loop = asyncio.get_running_loop()
        new = await loop.run_in_executor(executor, lambda: model.sample(
            ids, max_tokens=body.max_tokens, temperature=body.temperature, seed=body.seed))
        choice = {"index": 0, "text": model.tokenizer.decode(new),
                  "finish_reason": "stop" if new and new[-1] == model.tokenizer.eos_token_id else "length",
                  "logprobs": None}
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
        return {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
                "model": served_name, "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(new),
                          "total_tokens": len(ids) + len(new)}}

    return app


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

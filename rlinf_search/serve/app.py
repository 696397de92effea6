"""The OpenAI-compatible server: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``.

Point OpenAI's clients at it (``base_url=http://host:port/v1``): the chat endpoint renders the messages through
the model's own chat template; both honour ``n``, ``stop``, ``stream`` (server-sent events, with
``stream_options.include_usage``), ``seed``, ``temperature`` and ``max_tokens``; chat answers ``logprobs`` and
``top_logprobs``; completions answer vLLM's scoring fields (``echo``, ``logprobs: k``, ``return_tokens_as_token_ids``:
``scoring.py``), which the distillation teacher client uses. A field this server cannot honour is a 400 naming it
(``requests.py``), in OpenAI's error body. With an API key (``--api-key`` or ``RLINF_SERVE_API_KEY``) every ``/v1``
route needs ``Authorization: Bearer <key>``; the key is never logged or echoed.

One generation runs at a time, on the model's thread; the event loop tokenizes on other threads and only relays
tokens, so ``/health`` answers during a generation. A client that disconnects stops its generation before the
next token (``generation.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rlinf_search.net.serving import ClientError, ClientGone, read_body
from rlinf_search.serve.completion_model import CompletionModel, SampledToken
from rlinf_search.serve.generation import Finished, GenerationParams, TextDelta, generate
from rlinf_search.serve.requests import ChatCompletionRequest, CompletionRequest, SamplingFields
from rlinf_search.serve.scoring import scored_choice

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
API_KEY_ENV = "RLINF_SERVE_API_KEY"
# A text prompt longer than this many characters per token of the model's context cannot fit: refused before it is
# tokenized (a 15 MB prompt took 23 s to tokenize).
_MAX_CHARS_PER_TOKEN = 64
# How often a generation whose client waits for the whole answer checks that the client is still there.
_DISCONNECT_POLL_S = 0.1
_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 408: "timeout_error"}  # else invalid_request_error


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    code = "invalid_api_key" if status == 401 else "model_not_found" if status == 404 else None
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


class _RequireKey:
    """Every ``/v1`` request must carry ``Authorization: Bearer <key>`` (``/health`` stays open for probes). Plain ASGI,
    so a refused request costs no body read."""

    def __init__(self, app, *, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(error_body(401, "missing or wrong API key: send Authorization: Bearer <key>"),
                                        status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(model: CompletionModel, *, served_name: str, api_key: str | None = None) -> FastAPI:
    """The app around a loaded model; generations run one at a time on a worker thread."""
    app = FastAPI(title="rlinf-search OpenAI-compatible server")
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
    vocab = len(model.tokenizer)
    if api_key:
        app.add_middleware(_RequireKey, key=api_key)

    @app.exception_handler(ClientError)
    async def _client_error(_request: Request, exc: ClientError):
        return JSONResponse(error_body(exc.status, exc.message, exc.param), status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def _client_gone(_request: Request, _exc: ClientGone):
        return Response(status_code=499)  # never delivered: the connection is closed

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        log.exception("internal error")
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "rlinf-search"}]}

    def check(body: SamplingFields) -> None:
        if body.model != served_name:
            raise ClientError(404, f"model {body.model!r} is not served here; this server serves {served_name!r}",
                              param="model")
        body.check_supported()

    def budget(ids: list[int], max_tokens: int | None) -> int:
        """``max_tokens``, checked against the context (None: what the context leaves)."""
        if not ids:
            raise ClientError(400, "prompt is empty", param="prompt")
        room = model.max_length - len(ids)
        if max_tokens is None:
            max_tokens = room
        if max_tokens > room:
            raise ClientError(400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceed the model's "
                                   f"{model.max_length} tokens", param="max_tokens")
        return max_tokens

    def choices(body: SamplingFields, max_tokens: int, top_logprobs: int = 0) -> list[GenerationParams]:
        """One set of parameters per choice; with a seed, choice i samples from seed + i."""
        return [GenerationParams(max_tokens=max_tokens, temperature=body.temperature,
                                 seed=None if body.seed is None else (body.seed + i) % 2**64, stops=body.stops(),
                                 top_logprobs=top_logprobs, ignore_eos=body.ignore_eos) for i in range(body.n)]

    async def text_ids(text: str) -> list[int]:
        if len(text) > model.max_length * _MAX_CHARS_PER_TOKEN:
            raise ClientError(400, f"prompt of {len(text)} characters cannot fit the model's {model.max_length} "
                                   "tokens", param="prompt")
        # On a thread of its own: a long prompt must not stop /health or other requests being read.
        return await asyncio.to_thread(model.encode, text, special_tokens=True)

    async def whole(request: Request, ids: list[int], params: list[GenerationParams]) -> list[Choice]:
        """Every choice generated in full, stopped early if the client leaves (then ``ClientGone``)."""
        gone = threading.Event()

        async def run() -> list[Choice]:
            return [await Choice.collect(generate(model, executor, ids, p, gone)) for p in params]

        task = asyncio.ensure_future(run())
        while not task.done():
            await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                gone.set()
                await asyncio.gather(task, return_exceptions=True)
                raise ClientGone()
        return task.result()

    def stream(ids: list[int], params: list[GenerationParams], chunk, usage: bool) -> StreamingResponse:
        """Server-sent events: ``chunk(index, delta | finished)`` per step of each choice, then usage, ``[DONE]``."""
        gone = threading.Event()

        async def events():
            try:
                completion = 0
                for index, p in enumerate(params):
                    first = chunk(index, None)
                    if first is not None:
                        yield _event(first)
                    async for item in generate(model, executor, ids, p, gone):
                        completion += item.completion_tokens if isinstance(item, Finished) else 0
                        yield _event(chunk(index, item))
                if usage:
                    yield _event({**chunk(0, None, usage_only=True), "choices": [], "usage": _usage(ids, completion)})
                yield "data: [DONE]\n\n"
            finally:
                gone.set()  # the client left mid-stream: the model stops before its next token

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(request, CompletionRequest, MAX_BODY_BYTES)
        check(body)
        ids = list(body.prompt) if isinstance(body.prompt, list) else await text_ids(body.prompt)
        if any(not 0 <= token < vocab for token in ids):
            raise ClientError(400, f"prompt holds a token id outside the vocabulary (0-{vocab - 1})", param="prompt")
        max_tokens = budget(ids, 16 if body.max_tokens is None else body.max_tokens)  # OpenAI's default
        params = choices(body, max_tokens)
        head = {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
                "model": served_name}
        if body.stream:
            def chunk(index, item, usage_only=False):
                if item is None:
                    return head if usage_only else None
                text = item.text if isinstance(item, TextDelta) else ""
                reason = item.reason if isinstance(item, Finished) else None
                return {**head, "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": reason}]}

            return stream(ids, params, chunk, usage=bool(body.stream_options and body.stream_options.include_usage))
        done = await whole(request, ids, params)
        if body.echo or body.logprobs is not None:
            answers = [await scored_choice(model, executor, ids, done[0].ids, body)]
        else:
            answers = [{"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finished.reason}
                       for i, c in enumerate(done)]
        return {**head, "choices": answers, "usage": _usage(ids, sum(c.finished.completion_tokens for c in done))}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_body(request, ChatCompletionRequest, MAX_BODY_BYTES)
        check(body)
        if not getattr(model.tokenizer, "chat_template", None):
            raise ClientError(400, "this model's tokenizer has no chat template; use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        total = sum(len(m["content"]) for m in messages)
        if total > model.max_length * _MAX_CHARS_PER_TOKEN:
            raise ClientError(400, f"messages of {total} characters cannot fit the model's {model.max_length} tokens",
                              param="messages")
        try:
            text = await asyncio.to_thread(model.tokenizer.apply_chat_template, messages, tokenize=False,
                                           add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template raises what its author wrote (jinja, ValueError)
            raise ClientError(400, f"the chat template refused the messages: {str(exc).splitlines()[0][:200]}",
                              param="messages") from None
        ids = await asyncio.to_thread(model.encode, text, special_tokens=False)  # the template has its own
        top = (body.top_logprobs or 0) if body.logprobs else 0
        params = choices(body, budget(ids, body.token_budget), top_logprobs=top)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": served_name}
        if body.stream:
            head = {**head, "object": "chat.completion.chunk"}

            def chunk(index, item, usage_only=False):
                if item is None:
                    return head if usage_only else {**head, "choices": [
                        {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}]}
                if isinstance(item, Finished):
                    return {**head, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                                 "finish_reason": item.reason}]}
                logprobs = {"content": _chat_logprobs(model, item.tokens)} if body.logprobs else None
                return {**head, "choices": [{"index": index, "delta": {"content": item.text}, "logprobs": logprobs,
                                             "finish_reason": None}]}

            return stream(ids, params, chunk, usage=bool(body.stream_options and body.stream_options.include_usage))
        done = await whole(request, ids, params)
        answers = [{"index": i, "message": {"role": "assistant", "content": c.text},
                    "logprobs": {"content": _chat_logprobs(model, c.tokens)} if body.logprobs else None,
                    "finish_reason": c.finished.reason} for i, c in enumerate(done)]
        return {**head, "choices": answers, "usage": _usage(ids, sum(c.finished.completion_tokens for c in done))}

    return app


class Choice:
    """One choice generated in full."""

    def __init__(self, text: str, tokens: list[SampledToken], finished: Finished):
        self.text, self.tokens, self.finished = text, tokens, finished

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @classmethod
    async def collect(cls, items) -> Choice:
        text, tokens, finished = [], [], None
        async for item in items:
            if isinstance(item, TextDelta):
                text.append(item.text)
                tokens.extend(item.tokens)
            else:
                finished = item
        return cls("".join(text), tokens, finished)


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(ids: list[int], completion: int) -> dict:
    return {"prompt_tokens": len(ids), "completion_tokens": completion, "total_tokens": len(ids) + completion}


def _chat_logprobs(model: CompletionModel, tokens: list[SampledToken]) -> list[dict]:
    """OpenAI's chat ``logprobs.content``: each token's text, log-prob, UTF-8 bytes and its most likely rivals."""
    def entry(token: int, logprob: float) -> dict:
        text = model.tokenizer.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    return [{**entry(t.id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]} for t in tokens]

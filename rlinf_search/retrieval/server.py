"""The local retrieval server: ``POST /retrieve`` compatible with Search-R1, RLinf and ASearcher clients.

    python -m rlinf_search.retrieval.server --index-dir indexes/ --corpus corpus.jsonl --retriever minilm

Queries from concurrent requests are batched (``batcher.py``). Every client mistake is answered
with a 4xx and a one-line reason; the server keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlinf_search.net.serving import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    ClientError,
    ClientGone,
    bind_socket,
    read_body,
    serve_forever,
)
from rlinf_search.retrieval.batcher import DynamicBatcher, PerRequestSearch
from rlinf_search.retrieval.corpus import CorpusStore
from rlinf_search.retrieval.manifest import IndexMismatchError
from rlinf_search.retrieval.metrics import ServerMetrics
from rlinf_search.retrieval.pages import PageStore
from rlinf_search.retrieval.retrievers import Retriever, RetrieverOptions, available_indexes, open_retriever

log = logging.getLogger("rlinf_search.retrieval.server")


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for; anything beyond is a 4xx, not a slow or dying server."""

    default_topk: int = 3
    """Passages per query when the request gives no ``topk`` (Search-R1 uses 3)."""
    max_topk: int = 100
    """Largest ``topk`` accepted."""
    max_queries: int = 1024
    """Most queries in one request."""
    max_query_chars: int = 4096
    """Longest query accepted, in characters (the encoder truncates at 256-512 tokens anyway)."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Largest request body accepted."""
    max_urls: int = 256
    """Most URLs in one ``/access`` request."""
    body_timeout_s: float = BODY_TIMEOUT_S
    """A request body not received within this many seconds gets 408 and the connection is freed."""
    max_passages: int = 8192
    """Most passages in one response (queries x topk): 1,024 queries at topk 100 made a 28.8 MB response whose
    formatting held every other request (``/health`` included) for 2.5 s."""


# Responses with more passages than this are formatted on a worker thread, so the event loop keeps serving; small
# ones are formatted inline, where a thread hop would cost more than the work.
_INLINE_PASSAGES = 256


class RetrieveRequest(BaseModel):
    """Body of ``POST /retrieve``."""

    model_config = ConfigDict(extra="ignore")
    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


class AccessRequest(BaseModel):
    """Body of ``POST /access``."""

    model_config = ConfigDict(extra="ignore")
    urls: list[StrictStr]


def _render_result(corpus: CorpusStore, rows, scores, return_scores: bool) -> bytes:
    """The ``/retrieve`` response body, encoded (a response, not a dict: FastAPI would walk every passage through
    ``jsonable_encoder`` first)."""
    return json.dumps({"result": _format_hits(corpus, rows, scores, return_scores)}, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


def _format_hits(corpus: CorpusStore, rows, scores, return_scores: bool) -> list[list]:
    results = []
    for row_list, score_list in zip(rows, scores):
        hits = []
        for row, score in zip(row_list, score_list):
            if row < 0:
                continue
            document = corpus[int(row)].as_document()
            hits.append({"document": document, "score": float(score)} if return_scores else document)
        results.append(hits)
    return results


class _DeclaredBodyLimit:
    """Refuses a request whose declared ``Content-Length`` is over the limit before its body is read (``read_body``
    still caps a body sent without one). Plain ASGI: Starlette's ``@app.middleware("http")`` wraps every request in a
    task group and two memory streams, a third of the event loop's time at 32 clients (docs/history/benchmarks.md,
    section 1)."""

    def __init__(self, app, *, max_bytes: int, refuse: Callable[[int, str], JSONResponse]):
        self.app, self.max_bytes, self.refuse = app, max_bytes, refuse

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            length = next((value for name, value in scope["headers"] if name == b"content-length"), b"")
            if length.isdigit() and int(length) > self.max_bytes:
                message = f"request body of {int(length)} bytes exceeds the limit of {self.max_bytes} bytes"
                await self.refuse(413, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(corpus: CorpusStore, retriever: Retriever, *, limits: ServerLimits = ServerLimits(),
               batching: bool = True, batch_window_s: float = 0.002, max_batch: int = 64,
               batch_threads: int = 1, intra_op_threads: int | None = None,
               pages: PageStore | None = None) -> FastAPI:
    """Build the FastAPI app around a loaded corpus and retriever (``batch_threads``, ``intra_op_threads``: as
    ``DynamicBatcher``'s)."""
    metrics = ServerMetrics()
    searcher = (DynamicBatcher(retriever.search, metrics, window_s=batch_window_s, max_batch=max_batch,
                               batch_threads=batch_threads, intra_op_threads=intra_op_threads)
                if batching else PerRequestSearch(retriever.search, metrics))

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        searcher.start()
        yield
        await searcher.stop()

    app = FastAPI(title="rlinf-search retrieval server", lifespan=lifespan)

    def refuse(status: int, message: str) -> JSONResponse:
        metrics.record_error(status)
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(ClientError)
    async def _client_error(_request: Request, exc: ClientError):
        return refuse(exc.status, exc.message)

    @app.exception_handler(ClientGone)
    async def _client_gone(_request: Request, _exc: ClientGone):
        metrics.record_disconnect()
        return Response(status_code=499)  # never delivered: the connection is closed

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException):
        return refuse(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        log.exception("internal error")
        return refuse(500, f"internal error: {exc.__class__.__name__}")

    app.add_middleware(_DeclaredBodyLimit, max_bytes=limits.max_body_bytes, refuse=refuse)

    @app.post("/retrieve")
    async def retrieve(request: Request):
        started = time.perf_counter()
        body = await read_body(request, RetrieveRequest, limits.max_body_bytes, timeout_s=limits.body_timeout_s)
        topk = limits.default_topk if body.topk is None else body.topk
        if not body.queries:
            raise ClientError(400, "'queries' is empty: send at least one query string")
        if len(body.queries) > limits.max_queries:
            raise ClientError(413, f"{len(body.queries)} queries in one request; the limit is {limits.max_queries}")
        if not 1 <= topk <= limits.max_topk:
            raise ClientError(400, f"'topk' must be between 1 and {limits.max_topk}, got {topk}")
        longest = max(len(q) for q in body.queries)
        if longest > limits.max_query_chars:
            raise ClientError(413, f"a query of {longest} characters exceeds the limit of {limits.max_query_chars}")
        passages = len(body.queries) * topk
        if passages > limits.max_passages:
            raise ClientError(413, f"{len(body.queries)} queries x topk {topk} = {passages} passages in one response; "
                                   f"the limit is {limits.max_passages}: send fewer queries per request")
        rows, scores = await searcher.search(body.queries, topk)
        if passages > _INLINE_PASSAGES:
            content = await asyncio.to_thread(_render_result, corpus, rows, scores, body.return_scores)
        else:
            content = _render_result(corpus, rows, scores, body.return_scores)
        metrics.record_request(len(body.queries), time.perf_counter() - started)
        return Response(content, media_type="application/json")

    @app.post("/access")
    async def access(request: Request):
        if pages is None:
            raise ClientError(404, "this server has no page store; start it with --pages FILE")
        body = await read_body(request, AccessRequest, limits.max_body_bytes, timeout_s=limits.body_timeout_s)
        if not body.urls:
            raise ClientError(400, "'urls' is empty: send at least one URL")
        if len(body.urls) > limits.max_urls:
            raise ClientError(413, f"{len(body.urls)} urls in one request; the limit is {limits.max_urls}")
        return {"result": [pages.lookup(url) for url in body.urls]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "retriever": retriever.name, "corpus_rows": len(corpus),
                "batching": batching, "pages": pages is not None}

    @app.get("/metrics")
    async def get_metrics():
        return metrics.snapshot()

    return app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.retrieval.server",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", required=True, help="folder written by build_index")
    parser.add_argument("--corpus", required=True, help="the corpus jsonl the index was built on")
    parser.add_argument("--retriever", default=None,
                        help="bm25, hybrid, or a dense encoder name (default: the only index in --index-dir)")
    parser.add_argument("--dense", default=None, help="with hybrid: the dense index to fuse with bm25")
    parser.add_argument("--model", default=None, help="encoder model dir (default: as recorded at build)")
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request gives none")
    parser.add_argument("--max-topk", type=int, default=100, help="largest topk a request may ask for")
    parser.add_argument("--header-timeout-s", type=float, default=HEADER_TIMEOUT_S,
                        help="a client whose request headers are not complete this long after it connected gets 408")
    parser.add_argument("--body-timeout-s", type=float, default=BODY_TIMEOUT_S,
                        help="a request body not received within this many seconds gets 408")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --save-address-to)")
    parser.add_argument("--faiss-gpu", action="store_true", help="put the faiss index on all visible GPUs")
    parser.add_argument("--mmap-index", action="store_true", help="memory-map the faiss index (large Flat indexes)")
    parser.add_argument("--query-precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="query encoding on CPU: auto = bf16 batches where the CPU has AMX")
    parser.add_argument("--pages", default=None, help="jsonl of web pages served by POST /access")
    parser.add_argument("--no-batching", action="store_true",
                        help="search each request on its own (the reference servers' behaviour)")
    parser.add_argument("--batch-window-ms", type=float, default=2.0, help="wait for more queries this long")
    parser.add_argument("--max-batch", type=int, default=64, help="most queries searched in one batch")
    parser.add_argument("--batch-threads", type=int, default=1,
                        help="batches searched at once, each on its share of the cores (a batch alone takes them "
                             "all); 2 was not a clear gain at 32 clients on 2 cores, see docs/history/benchmarks.md")
    parser.add_argument("--save-address-to", default=None, help="write host:port here once listening")
    return parser


def _batch_threads(requested: int) -> dict:
    """``create_app``'s thread options: the process's cores split between ``requested`` batch threads."""
    if requested < 1:
        raise ValueError(f"--batch-threads must be >= 1, got {requested}")
    cores = len(os.sched_getaffinity(0))
    return {"batch_threads": requested, "intra_op_threads": max(1, cores // requested) if requested > 1 else None}


def _load(args: argparse.Namespace) -> tuple[CorpusStore, Retriever, PageStore | None]:
    corpus = CorpusStore(args.corpus)
    name = args.retriever
    if name is None:
        found = available_indexes(Path(args.index_dir))
        if len(found) != 1:
            raise IndexMismatchError(f"{args.index_dir} holds indexes {found}; choose one with --retriever")
        name = found[0]
    options = RetrieverOptions(model_path=args.model, dense=args.dense, use_gpu=args.faiss_gpu,
                               mmap=args.mmap_index, query_precision=args.query_precision)
    retriever = open_retriever(Path(args.index_dir), name, corpus, options)
    # The first call pays one-off costs, not the first client. It runs in a short-lived thread: once
    # the main thread has run a torch op, query encoding in the serving threads was measured 2x
    # slower on CPU (5 -> 10 ms for one query; likely OpenMP keeping the main thread's idle team).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm-up") as warm_up:
        warm_up.submit(retriever.search, ["warm up"], 1).result()  # .result() re-raises a failure
    pages = PageStore(args.pages) if args.pages else None
    return corpus, retriever, pages


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        threads = _batch_threads(args.batch_threads)
        corpus, retriever, pages = _load(args)
        sock = bind_socket(args.host, args.port)
    except (FileNotFoundError, IndexMismatchError, ValueError, OSError) as exc:
        print(f"retrieval server: {exc}", file=sys.stderr)
        return 1
    limits = ServerLimits(default_topk=args.topk, max_topk=args.max_topk, body_timeout_s=args.body_timeout_s)
    app = create_app(corpus, retriever, limits=limits, batching=not args.no_batching,
                     batch_window_s=args.batch_window_ms / 1000.0, max_batch=args.max_batch,
                     **threads, pages=pages)
    serve_forever(app, sock, address_file=args.save_address_to, header_timeout_s=args.header_timeout_s,
                  on_started=lambda address: log.info(
        "serving %s with %s on %s (%d passages)", args.corpus, retriever.name, address, len(corpus)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

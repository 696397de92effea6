"""``SearchClient``: the call machinery every backend shares.

A ``search()`` call goes: normalise the query -> LRU cache -> join an identical query already in
flight -> else join the open batch for its ``topk`` (coalescing) -> one backend request per batch,
under a concurrency cap and a rate limit, retried with jittered backoff, all inside the call's
deadline. Whatever goes wrong comes back as ``SearchOutcome.error``; a rollout never sees an
exception from a backend.

One client belongs to one event loop (its semaphore and futures are bound to it).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field

from rlinf_search.tools.search.base import SearchHit, SearchOutcome
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.net.retry import CallFailed, RetryingCaller, RetryPolicy
from rlinf_search.tools.search.limits import AnswerCache, normalise_query
from rlinf_search.tools.search.metrics import SearchMetrics
from rlinf_search.tools.search.transport import SearchBackend

log = logging.getLogger(__name__)

# A caller waits this much past its deadline as a safety net only: the batch it rides on has a
# deadline no later than the caller's, and reports the precise reason when that passes.
_WAIT_GRACE_S = 1.0

_CacheKey = tuple[str, int]


@dataclass
class _Answer:
    """What one query of a request came back with (the result of a shared future, never an exception)."""

    hits: list[SearchHit]
    error: str | None = None
    infra: bool = True
    """With ``error``: the service failed, not the query (``SearchOutcome.infra``)."""


@dataclass
class _Batch:
    """Queries with the same ``topk`` waiting for the coalescing window to close."""

    topk: int
    deadline: float
    keys: list[_CacheKey] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class SearchClient:
    """A ``SearchTool`` over any ``SearchBackend``."""

    def __init__(self, config: SearchToolConfig, backend: SearchBackend, *, rng: random.Random | None = None):
        self.config = config
        self.backend = backend
        self.metrics = SearchMetrics()
        self._cache = AnswerCache(config.cache_size)
        self._caller = RetryingCaller(search_retry_policy(config), rng=rng, on_attempt=self._count_attempt)
        self._inflight: dict[_CacheKey, asyncio.Future] = {}
        self._pending: dict[int, _Batch] = {}
        self._tasks: set[asyncio.Task] = set()

    def __repr__(self) -> str:
        return f"SearchClient(backend={self.backend!r}, topk={self.config.topk})"

    async def search(self, query: str, topk: int | None = None) -> SearchOutcome:
        """Search one query; backend failures come back as ``error``, never as an exception."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        k = self.config.topk if topk is None else topk
        if k < 1:
            raise ValueError(f"topk must be >= 1, got {k}")
        text = normalise_query(query)
        if not text:
            outcome = SearchOutcome(query=text, error="empty query: put search terms between <search> and </search>")
            return self._finish(outcome, started, shared=False)
        key = (text, k)
        cached = self._cache.get(key)
        if cached is not None:
            return self._finish(SearchOutcome(query=text, hits=cached, from_cache=True), started, shared=False)
        future = self._inflight.get(key)
        shared = future is not None
        if future is None:
            future = self._enqueue(key, started + self.config.deadline_s)
        remaining = started + self.config.deadline_s - loop.time()
        try:
            # shield: one caller giving up (or being cancelled) must not cancel the others' request.
            answer = await asyncio.wait_for(asyncio.shield(future), remaining + _WAIT_GRACE_S)
        except TimeoutError:
            answer = _Answer([], f"search backend at {self.backend.target} gave no answer within "
                                 f"the {self.config.deadline_s:g} s deadline")
        return self._finish(SearchOutcome(query=text, hits=list(answer.hits), error=answer.error,
                                          infra=answer.error is not None and answer.infra), started, shared=shared)

    def _finish(self, outcome: SearchOutcome, started: float, *, shared: bool) -> SearchOutcome:
        outcome.latency_s = asyncio.get_running_loop().time() - started
        self.metrics.record_call(outcome.latency_s, failed=outcome.error is not None,
                                 from_cache=outcome.from_cache, shared=shared)
        return outcome

    def _enqueue(self, key: _CacheKey, deadline: float) -> asyncio.Future:
        """Register a new in-flight query and put it in a request (now, or when its batch closes)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._inflight[key] = future
        topk = key[1]
        if not self.backend.batched or self.config.max_batch == 1:
            self._launch([key], [future], topk, deadline)
            return future
        batch = self._pending.get(topk)
        if batch is None:
            batch = self._pending[topk] = _Batch(topk=topk, deadline=deadline)
            batch.timer = loop.call_later(self.config.coalesce_window_s, self._flush, topk)
        batch.keys.append(key)
        batch.futures.append(future)
        batch.deadline = min(batch.deadline, deadline)
        if len(batch.keys) >= self.config.max_batch:
            self._flush(topk)
        return future

    def _flush(self, topk: int) -> None:
        """Close the open batch for ``topk`` and send it."""
        batch = self._pending.pop(topk, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        self._launch(batch.keys, batch.futures, topk, batch.deadline)

    def _launch(self, keys: list[_CacheKey], futures: list[asyncio.Future], topk: int, deadline: float) -> None:
        # Keep a reference: the loop holds tasks weakly, and an unreferenced one can vanish mid-flight.
        task = asyncio.get_running_loop().create_task(self._run(keys, futures, topk, deadline))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, keys: list[_CacheKey], futures: list[asyncio.Future], topk: int, deadline: float) -> None:
        """Send one request for ``keys`` and hand every waiting caller its own slice."""
        answers = await self._request_with_retries([text for text, _ in keys], topk, deadline)
        self._settle(keys, futures, answers)

    def _settle(self, keys: list[_CacheKey], futures: list[asyncio.Future], answers: list[_Answer]) -> None:
        for key, future, answer in zip(keys, futures, answers, strict=True):
            if answer.error is None:
                self._cache.put(key, answer.hits)
            if self._inflight.get(key) is future:
                del self._inflight[key]
            if not future.done():
                future.set_result(answer)

    async def _request_with_retries(self, queries: list[str], topk: int, deadline: float) -> list[_Answer]:
        """Try until success, a final error, ``max_retries`` retries or the deadline, whichever is first."""
        async def attempt() -> list[list[SearchHit]]:
            self.metrics.record_request(len(queries))
            return await self.backend.fetch(queries, topk, self.config.timeout_s)

        infra = True
        try:
            results = await self._caller.call(attempt, deadline=deadline)
        except CallFailed as failed:
            refused = failed.final is not None and failed.final.request_refused
            if refused and len(queries) > 1:
                # One query the server will not take (too long, say) refuses the whole coalesced request: ask for
                # each alone, so only the model that wrote it sees the refusal and the others get their passages.
                return await self._one_by_one(queries, topk, deadline)
            message = self._failure_message(failed)
            infra = not refused
        else:
            if len(results) == len(queries):
                return [_Answer(hits) for hits in results]
            message = (f"search backend at {self.backend.target} sent {len(results)} result lists for "
                       f"{len(queries)} queries")
        log.warning("%d quer%s failed: %s", len(queries), "y" if len(queries) == 1 else "ies", message)
        return [_Answer([], message, infra) for _ in queries]

    async def _one_by_one(self, queries: list[str], topk: int, deadline: float) -> list[_Answer]:
        answers = await asyncio.gather(*(self._request_with_retries([q], topk, deadline) for q in queries))
        return [answer for [answer] in answers]

    def _failure_message(self, failed: CallFailed) -> str:
        target, attempts, last = self.backend.target, failed.attempts, failed.last
        plural = "s" if attempts > 1 else ""
        if failed.final is not None:
            return f"search backend at {target} {failed.final.reason}"
        if failed.deadline_passed:
            cause = f", last: {last.what} ({last.cause})" if last else ""
            return (f"search backend at {target} gave no answer within the {self.config.deadline_s:g} s deadline "
                    f"({attempts} attempt{plural}{cause})")
        return f"search backend {last.what} at {target} after {attempts} attempt{plural} ({last.cause})"

    def _count_attempt(self, is_retry: bool) -> None:
        self.metrics.retries += int(is_retry)

    async def aclose(self) -> None:
        """Fail queued and in-flight queries with a 'closed' error and release the backend."""
        for batch in self._pending.values():
            if batch.timer is not None:
                batch.timer.cancel()
        self._pending.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A task cancelled before its first step never runs its body, so settle what is left here.
        closed = _Answer([], "search client closed before the backend answered")
        for future in self._inflight.values():
            if not future.done():
                future.set_result(closed)
        self._inflight.clear()
        await self.backend.aclose()


def search_retry_policy(config: SearchToolConfig) -> RetryPolicy:
    """``tools.search``'s limits as the shared retry policy. With several replicas one attempt may try each of them
    once, each within ``timeout_s``, so the attempt's own limit covers them all."""
    replicas = len(config.server_addrs) if config.backend == "local" else 1
    return RetryPolicy(timeout_s=config.timeout_s * replicas, max_retries=config.max_retries,
                       backoff_base_s=config.backoff_base_s, backoff_max_s=config.backoff_max_s,
                       max_concurrency=config.max_concurrency, rate_limit_per_s=config.rate_limit_per_s)

"""Dynamic batching: queries from concurrent requests are encoded and searched as one batch.

Query encoding dominates retrieval cost, and on a GPU an encoder forward pass over 32 queries costs
far less than 32 passes over one (on a 2-core CPU the encoder alone gains about 1.5x; see
docs/history/benchmarks.md). Requests wait in a queue; the collector takes everything queued (waiting a short
window for stragglers when the last batch served several requests, until as many as it served are back,
up to a maximum batch), searches
once in a batch thread and hands each request its rows. While a batch computes, the next one fills
up, so under load batches grow with no added wait, and a lone client pays no window.

With ``batch_threads`` above 1 (the server's ``--batch-threads``), a collection of at least 16 queries is
split over the free batch threads, each computing on its share of the cores for torch's intra-op work; a
batch alone takes every core. In-process on a 2-core CPU, two batches of 16 on one core each encoded
1.3x the queries of one batch of 32 on both, since one forward pass scales poorly over two cores; behind
HTTP the gain was not clear at 32 clients (docs/history/benchmarks.md section 1).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import anyio.to_thread
import numpy as np

from rlinf_search.retrieval.metrics import ServerMetrics

SearchFn = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)


RECENT_BATCHES = 8
"""Batches whose request counts set when a collection is full enough to stop waiting for stragglers."""

MIN_PART = 8
"""Fewest queries a collected batch is split into a part of, one part per free batch thread."""


class DynamicBatcher:
    """Collects queries across requests into batches of at most ``max_batch`` queries."""

    def __init__(self, search: SearchFn, metrics: ServerMetrics, *, window_s: float = 0.002,
                 max_batch: int = 64, batch_threads: int = 1, intra_op_threads: int | None = None):
        """``batch_threads``: batches computed at once; ``intra_op_threads``: torch threads each batch thread
        uses (None: torch's default, all cores)."""
        if batch_threads < 1 or (intra_op_threads is not None and intra_op_threads < 1):
            raise ValueError(f"batch_threads and intra_op_threads must be >= 1, got {batch_threads} and "
                             f"{intra_op_threads}")
        self._search = search
        self._metrics = metrics
        self._window_s = window_s
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        # One executor per batch thread, so a batch lands on a thread of its choosing: a batch alone goes to the
        # first with every core, and the others' OpenMP teams stay one thread (an idle team of several spins).
        self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"retrieval-batch-{i}")
                           for i in range(batch_threads)]
        self._free = list(range(batch_threads))
        self._intra_op_threads = intra_op_threads
        self._all_threads = None if intra_op_threads is None else intra_op_threads * batch_threads
        self._slots = asyncio.Semaphore(batch_threads)
        self._batches: set[asyncio.Task] = set()
        self._worker: asyncio.Task | None = None
        self._recent_batch_requests: deque[int] = deque(maxlen=RECENT_BATCHES)

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in (self._worker, *self._batches):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)

    async def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, topk, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        batch = [await self._queue.get()]
        size = len(batch[0].queries)
        # Wait for stragglers only when the last batch served several requests: a lone client would
        # pay the window on every request (2 of 10 ms on CPU) and never gain a batch-mate.
        last = self._recent_batch_requests[-1] if self._recent_batch_requests else 0
        window_s = self._window_s if last > 1 else 0.0
        deadline = time.perf_counter() + window_s
        while size < self._max_batch:
            # Closed-loop clients come back together: once as many requests are here as the largest recent batch
            # served, the rest of the window is the encoder idling, so take what is queued and go. (The largest, not
            # the last: a batch that missed a few stragglers would otherwise split the clients in two for good.)
            remaining = 0.0 if len(batch) >= self._full_batch_requests() else deadline - time.perf_counter()
            try:
                item = self._queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(
                    self._queue.get(), remaining)
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    def _full_batch_requests(self) -> int:
        return max(self._recent_batch_requests, default=0)

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()  # a batch thread is free: collect the next batch for it
            try:
                batch = await self._collect()
            except BaseException:
                self._slots.release()
                raise
            self._recent_batch_requests.append(len(batch))
            # Closed-loop clients come back together, so one collection holds all of them: split it over every
            # free batch thread (each part at least MIN_PART queries), or the other threads would stay idle.
            parts = 1
            queries = sum(len(item.queries) for item in batch)
            while not self._slots.locked() and queries >= (parts + 1) * MIN_PART and parts < len(batch):
                await self._slots.acquire()
                parts += 1
            alone = parts == 1 and len(self._free) == len(self._executors)
            split = _split(batch, parts)
            for _ in range(parts - len(split)):  # a very uneven batch fills fewer parts: free the slots unused
                self._slots.release()
            for part in split:
                # Alone, a batch takes every core (a lone client's latency); beside another, its share.
                executor = self._free.pop(0)  # the first free one: batches alone always go to thread 0
                threads = self._all_threads if alone else self._intra_op_threads
                task = asyncio.get_running_loop().create_task(self._serve(part, executor, threads))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _serve(self, batch: list[_Pending], executor: int, threads: int | None) -> None:
        try:
            queries = [q for item in batch for q in item.queries]
            topk = max(item.topk for item in batch)
            self._metrics.record_batch(len(queries))
            loop = asyncio.get_running_loop()
            try:
                rows, scores = await loop.run_in_executor(self._executors[executor], _search_on, threads,
                                                          self._search, queries, topk, self._metrics)
            except Exception as exc:  # noqa: BLE001 - the failure belongs to the waiting requests
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                return
            begin = 0
            for item in batch:
                end = begin + len(item.queries)
                if not item.future.done():  # the client may have gone away
                    item.future.set_result((rows[begin:end, : item.topk], scores[begin:end, : item.topk]))
                begin = end
        finally:
            self._free.append(executor)
            self._free.sort()
            self._slots.release()


def _split(batch: list[_Pending], parts: int) -> list[list[_Pending]]:
    """``batch`` in ``parts`` runs of consecutive requests with about equal numbers of queries."""
    total = sum(len(item.queries) for item in batch)
    out: list[list[_Pending]] = [[] for _ in range(parts)]
    done = 0
    for item in batch:
        index = min(parts - 1, done * parts // total)
        out[index].append(item)
        done += len(item.queries)
    return [part for part in out if part]


def _search_on(threads: int | None, search: SearchFn, queries: list[str], topk: int, metrics: ServerMetrics):
    """``search`` in a batch thread with ``threads`` intra-op threads (OpenMP's count is per calling thread), its
    time recorded."""
    if threads is not None:
        import torch

        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        return search(queries, topk)
    finally:
        metrics.record_search_time(time.perf_counter() - started)


class PerRequestSearch:
    """The reference servers' behaviour, kept for comparison: each request is searched on its own
    in the web framework's thread pool, concurrently with the others."""

    def __init__(self, search: SearchFn, metrics: ServerMetrics):
        self._search = search
        self._metrics = metrics

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        self._metrics.record_batch(len(queries))
        return await anyio.to_thread.run_sync(_search_on, None, self._search, queries, topk, self._metrics)

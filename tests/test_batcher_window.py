"""The batcher's straggler window ends as soon as every client of the last full batch is back: closed-loop clients
(the search tool's, the benchmark's) do not pay the window on every batch, and their batches stay whole."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from rlinf_search.retrieval.batcher import DynamicBatcher
from rlinf_search.retrieval.metrics import ServerMetrics


def _search(queries: list[str], topk: int):
    time.sleep(0.01)
    ids = np.array([[int(q)] * topk for q in queries])
    return ids, ids.astype(np.float32)


def test_closed_loop_clients_do_not_wait_out_the_window():
    metrics = ServerMetrics()

    async def client(batcher: DynamicBatcher, number: int, rounds: int) -> list[int]:
        return [int((await batcher.search([str(number)], 1))[0][0, 0]) for _ in range(rounds)]

    async def run() -> tuple[list[list[int]], float]:
        batcher = DynamicBatcher(_search, metrics, window_s=0.5)
        batcher.start()
        try:
            started = time.perf_counter()
            answers = await asyncio.gather(*(client(batcher, n, 5) for n in range(8)))
            return answers, time.perf_counter() - started
        finally:
            await batcher.stop()

    answers, elapsed = asyncio.run(run())
    assert answers == [[n] * 5 for n in range(8)]
    assert metrics.snapshot()["batch_size_histogram"] == {"8": 5}  # every round one whole batch
    # Four rounds after the first could each wait the 0.5 s window; all eight clients are back long before it ends.
    assert elapsed < 0.5, f"5 rounds took {elapsed:.2f} s"
    assert metrics.snapshot()["search_busy_s"] >= 5 * 0.01

"""The dynamic batcher with two batch threads: a crowd of queries is split over both, each on its share of the
cores; a lone query runs alone on the first thread with every core; uneven requests lose no slot."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import torch

from rlinf_search.retrieval.batcher import DynamicBatcher
from rlinf_search.retrieval.metrics import ServerMetrics


class RecordingSearch:
    """Scores each query by its number; notes the thread, its torch thread count and the batch size of each call."""

    def __init__(self):
        self.calls: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def __call__(self, queries: list[str], topk: int):
        with self._lock:
            self.calls.append((threading.current_thread().name, torch.get_num_threads(), len(queries)))
        time.sleep(0.05)  # long enough for the batches of one collection to overlap
        ids = np.array([[int(q)] * topk for q in queries])
        return ids, ids.astype(np.float32)


async def _ask(batcher: DynamicBatcher, numbers: list[list[int]]) -> list[list[int]]:
    answers = await asyncio.gather(*(batcher.search([str(n) for n in group], 1) for group in numbers))
    return [rows[:, 0].tolist() for rows, _ in answers]


def test_a_crowd_splits_over_both_threads_and_a_lone_query_takes_every_core():
    search = RecordingSearch()

    async def run():
        batcher = DynamicBatcher(search, ServerMetrics(), batch_threads=2, intra_op_threads=1)
        batcher.start()
        try:
            crowd = await _ask(batcher, [[n] for n in range(32)])
            lone = await _ask(batcher, [[99]])
            uneven = await _ask(batcher, [[1], list(range(100, 120))])  # 21 queries, too uneven for two parts
            again = await _ask(batcher, [[n] for n in range(32)])
        finally:
            await batcher.stop()
        return crowd, lone, uneven, again

    crowd, lone, uneven, again = asyncio.run(run())
    assert crowd == [[n] for n in range(32)] and again == crowd and lone == [[99]]
    assert uneven == [[1], list(range(100, 120))]  # every request gets its own rows back
    first = search.calls[:2]
    assert sorted(size for _, _, size in first) == [16, 16]  # one collection of 32, split in two
    assert {name for name, _, _ in first} == {"retrieval-batch-0_0", "retrieval-batch-1_0"}
    assert all(threads == 1 for _, threads, _ in first)  # each on its share of the cores
    name, threads, size = search.calls[2]
    assert (name, threads, size) == ("retrieval-batch-0_0", 2, 1)  # alone: the first thread, every core
    assert sorted(size for _, _, size in search.calls[-2:]) == [16, 16]  # no slot was lost to the uneven batch

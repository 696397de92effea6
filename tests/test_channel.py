"""Channels on a real local Ray: FIFO under concurrent producers and consumers in workers, replies
routed by key among many concurrent callers, back-pressure, batches, timeouts and large payloads."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from rlinf_search.scheduler import Channel, Cluster, ClusterConfig, Worker
from rlinf_search.scheduler.channel import _Stored


class SyncClient(Worker):
    """Blocking channel calls, as a plain (threaded) worker makes them."""

    def produce(self, channel: Channel, n: int) -> None:
        for i in range(n):
            channel.put((self.rank, i))

    def consume(self, channel: Channel, n: int) -> list:
        return [channel.get() for _ in range(n)]

    def serve(self, channel: Channel) -> int:
        """Answer requests until a None arrives; each reply goes to the key the request names."""
        served = 0
        while (request := channel.get()) is not None:
            channel.put({"answer": request["question"] * 2, "server": self.rank}, key=request["reply_to"])
            served += 1
        return served

    def big_array(self, channel: Channel, size: int) -> None:
        channel.put(np.arange(size, dtype=np.float32))


class AsyncClient(Worker):
    """Coroutine channel calls from an async worker: many callers in flight in one process."""

    async def ask_many(self, channel: Channel, n: int) -> list[tuple[int, dict]]:
        async def ask(i: int) -> tuple[int, dict]:
            question = self.rank * 1000 + i
            await channel.aput({"question": question, "reply_to": ("caller", self.rank, i)})
            return question, await channel.aget(key=("caller", self.rank, i))

        return await asyncio.gather(*(ask(i) for i in range(n)))

    async def take_batch(self, channel: Channel, n: int) -> list:
        return await channel.aget_batch(n)


@pytest.fixture(scope="module")
def cluster():
    with Cluster(ClusterConfig(cpu_slots_per_node=4, num_cpus=2)) as running:
        yield running


@pytest.fixture(scope="module")
def sync_clients(cluster):
    group = SyncClient.create_group().launch(cluster, "0-2", name="sync_clients")
    yield group
    group.shutdown()


# First in this module, so the module's cluster starts Ray with the test modules on its workers' import path before
# any test below touches Ray (a Ray started implicitly by a Channel has no such path, and later modules reuse it).
def test_fifo_per_producer_with_concurrent_producers_and_consumers(cluster, sync_clients):
    channel = Channel.create("fifo")
    consumers = SyncClient.create_group().launch(cluster, "3,0", name="consumers")
    try:
        produced = sync_clients.call("produce", channel, 100)  # 3 producers x 100 items
        taken = consumers.call("consume", channel, 150)  # 2 consumers x 150 items
        produced.wait(timeout=120)
        batches = taken.wait(timeout=120)
        everything = [item for batch in batches for item in batch]
        assert sorted(everything) == [(p, i) for p in range(3) for i in range(100)]
        for batch in batches:  # each consumer sees every producer's items in the order they were put
            for producer in range(3):
                sequence = [i for p, i in batch if p == producer]
                assert sequence == sorted(sequence)
        assert channel.qsize() == 0
    finally:
        consumers.shutdown()
        channel.close()


def test_a_single_consumer_sees_exact_put_order():
    channel = Channel.create("order")
    for i in range(50):
        channel.put(i)
    assert channel.get_batch(50) == list(range(50))
    channel.close()


def test_replies_reach_their_caller_among_many_concurrent_ones(cluster, sync_clients):
    channel = Channel.create("requests")
    callers = AsyncClient.create_group().launch(cluster, "0-1", name="callers")
    try:
        servers = sync_clients.call_on([0, 1], "serve", channel)
        answers = callers.call("ask_many", channel, 25).wait(timeout=120)  # 50 callers in flight
        for question, reply in (pair for rank in answers for pair in rank):
            assert reply["answer"] == question * 2
        assert sorted(q for rank in answers for q, _ in rank) == sorted(
            r * 1000 + i for r in range(2) for i in range(25))
        for _ in range(2):
            channel.put(None)
        assert sum(servers.wait(timeout=60)) == 50
    finally:
        callers.shutdown()
        channel.close()


def test_back_pressure_blocks_the_third_put_until_a_get():
    channel = Channel.create("bounded", maxsize=2)
    channel.put("a")
    channel.put("b")
    returned_at: list[float] = []
    blocked = threading.Thread(target=lambda: (channel.put("c"), returned_at.append(time.monotonic())))
    started = time.monotonic()
    blocked.start()
    time.sleep(0.5)
    assert not returned_at and channel.qsize() == 2  # still waiting for room
    got_at = time.monotonic()
    assert channel.get() == "a"
    blocked.join(timeout=10)
    waited = returned_at[0] - started
    # Released by the get (two actor calls later; generous for a loaded 2-core machine).
    assert waited >= 0.5 and returned_at[0] - got_at < 2.0, f"third put returned after {waited:.3f} s"
    assert channel.get_batch(2) == ["b", "c"]

    channel.put("d")
    channel.put("e")
    with pytest.raises(TimeoutError, match="channel 'bounded': put on key None found the queue full"):
        channel.put("f", timeout=0.2)
    assert channel.get_batch(2) == ["d", "e"]  # the timed-out put added nothing
    with pytest.raises(ValueError, match="get_batch\\(3\\) can never fill a key bounded to 2 items"):
        channel.get_batch(3)
    channel.close()


def test_back_pressure_is_per_key():
    channel = Channel.create("per_key", maxsize=1)
    channel.put(1, key="a")
    channel.put(2, key="b", timeout=1)  # another key has its own room
    assert (channel.get(key="b"), channel.get(key="a")) == (2, 1)
    channel.close()


def test_get_batch_waits_for_all_and_a_timeout_loses_nothing(cluster):
    channel = Channel.create("batches")
    takers = AsyncClient.create_group().launch(cluster, "1", name="takers")
    try:
        for i in range(5):
            channel.put(i)
        assert channel.get_batch(3) == [0, 1, 2]
        with pytest.raises(TimeoutError, match="get of 3 item\\(s\\) on key None found 2 for 0.3 s"):
            channel.get_batch(3, timeout=0.3)
        with pytest.raises(TimeoutError):
            channel.get(key="empty", timeout=0.2)
        pending = takers.call_on(0, "take_batch", channel, 4)
        time.sleep(0.3)
        channel.put(5)
        channel.put(6)
        assert pending.wait(timeout=30) == [3, 4, 5, 6]  # the two left over by the timeout come first
    finally:
        takers.shutdown()
        channel.close()


def test_large_payloads_travel_by_reference(cluster, sync_clients):
    import torch

    channel = Channel.create("large")
    array = np.random.default_rng(0).standard_normal(250_000).astype(np.float32)  # 1 MB
    assert isinstance(channel._wrap(array), _Stored)
    assert not isinstance(channel._wrap(array[:100]), _Stored)
    channel.put({"tokens": torch.arange(300_000), "meta": "x"})
    received = channel.get()
    assert torch.equal(received["tokens"], torch.arange(300_000)) and received["meta"] == "x"
    channel.put(array)
    np.testing.assert_array_equal(channel.get(), array)
    sync_clients.call_on(0, "big_array", channel, 1_000_000).wait(timeout=60)  # from a worker
    np.testing.assert_array_equal(channel.get(), np.arange(1_000_000, dtype=np.float32))
    channel.close()

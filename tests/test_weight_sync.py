"""Weight sync on a real local Ray: a 1 M-parameter policy in an actor group, changed by a "train
step", sent to rollout groups through the object store (collocated) and by broadcast
(disaggregated); receivers must hold bitwise-equal tensors and the version that was sent, and a
receiver that loads bucket by bucket is never more than a bucket behind the sender."""

from __future__ import annotations

import time

import pytest
import torch

from rlinf_search.scheduler import Cluster, ClusterConfig, WeightSync, Worker
from rlinf_search.scheduler.weight_buckets import plan_buckets


def make_policy(seed: int) -> torch.nn.Module:
    """A 2-layer MLP (1.05 M fp32 parameters) with a bf16 and an int64 buffer, so dtypes numpy lacks
    and 0-d tensors travel too, and an embedding tied to a head, as a tied LM head is."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    model.register_buffer("scale", torch.randn(7, 3).to(torch.bfloat16))
    model.register_buffer("steps", torch.tensor(0))
    model.add_module("embed", torch.nn.Embedding(64, 32))
    model.add_module("head", torch.nn.Linear(32, 64, bias=False))
    model.head.weight = model.embed.weight
    return model


class ReadLog(dict):
    """A state dict that notes when each tensor was first read (a transport reads a bucket's tensors to pack it)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read_at: dict[str, float] = {}

    def __getitem__(self, name):
        self.read_at.setdefault(name, time.time())
        return super().__getitem__(name)


class PolicyActor(Worker):
    def __init__(self):
        self.model = make_policy(seed=0)

    def train_step(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for tensor in self.model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.add_(torch.randn(tensor.shape, generator=generator).to(tensor.dtype))
            self.model.steps += 1

    def get_weights(self) -> dict[str, torch.Tensor]:
        self.sent = ReadLog(self.model.state_dict())
        return self.sent

    def read_times(self) -> dict[str, float]:
        return self.sent.read_at

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.model.state_dict().items()}

    def allreduce_rank(self) -> float:
        value = torch.tensor([float(self.rank)])
        torch.distributed.all_reduce(value)
        return value.item()


class Rollout(Worker):
    def __init__(self):
        self.model = make_policy(seed=1)  # different weights until the first sync
        self.version: int | None = None

    def set_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(state_dict)
        self.version = version

    def snapshot(self) -> tuple[int | None, dict[str, torch.Tensor]]:
        return self.version, {name: t.clone() for name, t in self.model.state_dict().items()}


class SlowStreamingRollout(Rollout):
    """Loads each bucket as it arrives, slowly, noting when it took each."""

    def set_weight_buckets(self, buckets, version: int) -> None:
        self.taken_at = []
        own = self.model.state_dict()
        for bucket in buckets:
            self.taken_at.append(time.time())
            time.sleep(0.3)
            for name, tensor in bucket.items():
                own[name].copy_(tensor)
        self.version = version

    def take_times(self) -> list[float]:
        return self.taken_at


@pytest.fixture(scope="module")
def cluster():
    with Cluster(ClusterConfig(cpu_slots_per_node=4, num_cpus=2)) as running:
        yield running


@pytest.fixture(scope="module")
def actor(cluster):
    group = PolicyActor.create_group().launch(cluster, "0-1", name="actor", init_process_group=True)
    yield group
    group.shutdown()


def assert_synced(actor, receivers, version: int) -> None:
    expected = actor.call_on(0, "snapshot").wait(timeout=60)
    for group in receivers:
        for got_version, state in group.call("snapshot").wait(timeout=60):
            assert got_version == version
            assert state.keys() == expected.keys()
            for name, tensor in expected.items():
                assert state[name].dtype == tensor.dtype and state[name].shape == tensor.shape
                assert torch.equal(state[name].view(-1).view(torch.uint8), tensor.view(-1).view(torch.uint8)), name


def sync_twice(actor, receivers, sync: WeightSync) -> None:
    before = actor.call_on(0, "snapshot").wait(timeout=60)
    for version in (1, 2):
        actor.call("train_step", version).wait(timeout=60)
        sync.sync(version)
        assert sync.version == version
        assert_synced(actor, receivers, version)
    after = actor.call_on(0, "snapshot").wait(timeout=60)
    assert not torch.equal(before["0.weight"], after["0.weight"])  # the weights did change
    with pytest.raises(ValueError, match="version 2 does not advance past 2"):
        sync.sync(2)


def test_collocated_sync_goes_through_the_object_store(cluster, actor):
    rollout = Rollout.create_group().launch(cluster, "0-1", name="rollout")
    try:
        with WeightSync(actor, [rollout]) as sync:
            assert sync.method == "object_store"
            sync_twice(actor, [rollout], sync)
    finally:
        rollout.shutdown()


@pytest.mark.parametrize("placement, method", [("0-1", "object_store"), ("2-3", "broadcast")])
def test_a_streaming_receiver_is_at_most_a_bucket_behind_the_sender(cluster, actor, placement, method):
    bucket_bytes = 512 * 1024
    rollout = SlowStreamingRollout.create_group().launch(cluster, placement, name="rollout")
    try:
        with WeightSync(actor, [rollout], bucket_bytes=bucket_bytes, timeout_s=120) as sync:
            assert sync.method == method
            actor.call("train_step", 5).wait(timeout=60)
            sync.sync(1)
            assert_synced(actor, [rollout], 1)
        plan = plan_buckets(make_policy(0).state_dict(), bucket_bytes, version=1)  # the layout the actor sent
        assert plan.aliases == {"head.weight": "embed.weight"} and len(plan.buckets) == 5
        packed_at = actor.call_on(0, "read_times").wait(timeout=60)
        first_packed = [min(packed_at[slot.name] for slot in slots) for slots in plan.buckets]
        for taken_at in rollout.call("take_times").wait(timeout=60):
            assert len(taken_at) == len(plan.buckets)
            # Bucket k+2 is packed only once the receiver has taken bucket k: the receiver holds the bucket it
            # loads and at most one more. A sender that did not wait would pack them all within a few ms, 0.3 s
            # or more before. (The sender may learn of a take a little before the receiver notes its time.)
            for k in range(len(plan.buckets) - 2):
                assert first_packed[k + 2] >= taken_at[k] - 0.1, k
    finally:
        rollout.shutdown()


def test_disaggregated_sync_broadcasts_to_every_receiver_group(cluster, actor):
    rollout = Rollout.create_group().launch(cluster, "2-3", name="rollout")
    inference = Rollout.create_group().launch(cluster, "2", name="inference")
    try:
        with WeightSync(actor, [rollout, inference], timeout_s=120) as sync:
            assert sync.method == "broadcast"
            sync_twice(actor, [rollout, inference], sync)
        # The sync group was its own: the actor's training group still works, and a new sync opens.
        assert actor.call("allreduce_rank").wait(timeout=60) == [1.0, 1.0]
        with WeightSync(actor, [rollout], method="broadcast", timeout_s=120) as again:
            actor.call("train_step", 3).wait(timeout=60)
            again.sync(3)
            assert_synced(actor, [rollout], 3)
    finally:
        rollout.shutdown()
        inference.shutdown()


def test_cuda_ipc_on_a_cpu_cluster_is_refused_before_anything_opens(cluster, actor):
    rollout = Rollout.create_group().launch(cluster, "0", name="rollout")
    try:
        with pytest.raises(ValueError, match="cuda_ipc needs every receiver rank on the GPU of the sender's rank 0"):
            WeightSync(actor, [rollout], method="cuda_ipc")
    finally:
        rollout.shutdown()


def test_unknown_method_is_refused(actor):
    with pytest.raises(ValueError, match="weight sync method must be one of auto, object_store, cuda_ipc, broadcast"):
        WeightSync(actor, [], method="nccl")

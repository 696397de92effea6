"""Weight transports: how one sender rank's state dict reaches every receiver rank, bucket by bucket.

The interface is ``WeightTransport``: ``send(state_dict, version)`` on the sender rank, ``receive_stream()`` on
each receiver rank, which returns the version and an iterator of buckets (partial state dicts) that arrive while
the receiver loads the ones before. All three speak the bucket protocol of ``weight_buckets``: a plan, then flat
buckets, each tied tensor once.

- ``ObjectStoreTransport`` (collocated, any device): each bucket is one ``ray.put``; receivers read it as a view of
  shared memory. The channel holds one item per receiver, so the sender packs bucket k+2 only once every receiver
  has taken bucket k+1: a receiver maps at most two buckets at a time, the object store holds at most three.
- ``CudaIpcTransport`` (collocated on one GPU): each bucket is packed on the sender's GPU and handed over as a CUDA
  IPC handle; the receiver copies from it device to device and acknowledges, and the sender keeps at most two
  buckets alive. No host memory is touched. Untested on GPU.
- ``BroadcastTransport`` (disaggregated): a ``torch.distributed`` broadcast per bucket over a gloo (CPU) or nccl
  (GPU) group of the sender rank and every receiver rank, on its own port, torn down by ``close``.
"""

from __future__ import annotations

import pickle
import warnings
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Union

from rlinf_search.scheduler.weight_buckets import BucketPlan, collect, pack_bucket, plan_buckets, unpack_bucket

if TYPE_CHECKING:
    import torch

    from rlinf_search.scheduler.channel import Channel

# Ray is imported where the object store is used: the CUDA IPC transport also runs where Ray is absent (the GPU
# check drives it between two processes with a mailbox of its own).

Buckets = Iterator[dict[str, "torch.Tensor"]]
"""A sync's buckets as they arrive: each a partial state dict of views, valid until the next is asked for."""


class WeightTransport(ABC):
    """Moves a state dict from one sender rank to every receiver rank, with a version number."""

    wants_device_tensors = False
    """True when the sender's tensors are best left on its device (the bucket is packed there)."""

    @abstractmethod
    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """On the sender: deliver ``state_dict`` at ``version`` to every receiver."""

    @abstractmethod
    def receive_stream(self) -> tuple[int, Buckets]:
        """On a receiver: wait for the next sync's plan; return its version and its buckets. Every bucket must be
        taken (the sender waits for it), and each bucket's tensors read before the next is asked for."""

    def receive(self) -> tuple[dict[str, torch.Tensor], int]:
        """On a receiver: the whole state dict at once (the buckets' memory stays mapped until it is dropped)."""
        version, buckets = self.receive_stream()
        return collect(buckets), version

    def close(self) -> None:
        """Release what the transport holds (sockets, process groups)."""


@dataclass(frozen=True)
class ObjectStoreSpec:
    """How one participant opens an ``ObjectStoreTransport`` (picklable: built on the driver)."""

    channel: Channel
    """Carries the plan and one object-store reference per bucket to each receiver; one item per receiver at a
    time (``maxsize`` 1)."""
    num_receivers: int
    receiver_index: int | None
    """This participant's index among the receivers; None on the sender."""
    bucket_bytes: int
    """Bytes per bucket (about)."""

    def open(self) -> ObjectStoreTransport:
        return ObjectStoreTransport(self)


@dataclass(frozen=True)
class CudaIpcSpec:
    """How one participant opens a ``CudaIpcTransport`` (picklable: built on the driver)."""

    channel: Channel
    """Carries the plan and each bucket's IPC handle to the receivers, and their acknowledgements back: a ``Channel``
    of ``maxsize`` 1, or anything with its ``put(item, key)`` and ``get(key, timeout=)``."""
    num_receivers: int
    receiver_index: int | None
    """This participant's index among the receivers; None on the sender."""
    bucket_bytes: int
    """Bytes per bucket (about); the sender's GPU holds at most two."""
    timeout_s: float
    """How long the sender waits for a bucket's acknowledgements."""

    def open(self) -> CudaIpcTransport:
        return CudaIpcTransport(self)


@dataclass(frozen=True)
class BroadcastSpec:
    """How one participant opens a ``BroadcastTransport`` (picklable: built on the driver)."""

    master_addr: str
    master_port: int
    """A port of its own on the sender's node, apart from the groups' ``MASTER_PORT``."""
    rank: int
    """0 is the sender; receivers are 1..world_size-1."""
    world_size: int
    backend: str
    """``gloo`` (tensors on CPU) or ``nccl`` (tensors on the rank's GPU)."""
    timeout_s: float
    bucket_bytes: int
    """Tensors are packed into flat buffers of about this size: one collective each, not one per tensor."""

    def open(self) -> BroadcastTransport:
        return BroadcastTransport(self)


TransportSpec = Union[ObjectStoreSpec, CudaIpcSpec, BroadcastSpec]


class _ChannelFanOut:
    """The sender's side of a channel to ``num_receivers`` keys (0..n-1)."""

    def __init__(self, channel: Channel, num_receivers: int):
        self.channel, self.num_receivers = channel, num_receivers

    def to_all(self, item) -> None:
        for index in range(self.num_receivers):
            self.channel.put(item, key=index)


class ObjectStoreTransport(WeightTransport):
    """One ``ray.put`` per bucket; receivers read it from shared memory (same node) or via Ray."""

    def __init__(self, spec: ObjectStoreSpec):
        self._spec = spec
        self._fan_out = _ChannelFanOut(spec.channel, spec.num_receivers)

    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        import ray

        plan = plan_buckets(state_dict, self._spec.bucket_bytes, version)
        self._fan_out.to_all(plan)
        for slots, size in zip(plan.buckets, plan.sizes):
            ref = ray.put(pack_bucket(state_dict, slots, size).numpy())
            # In a list, so the reference travels and the receivers share one copy. The put waits while a
            # receiver still has the bucket before this one queued: that is the back-pressure.
            self._fan_out.to_all([ref])
            del ref

    def receive_stream(self) -> tuple[int, Buckets]:
        plan: BucketPlan = self._spec.channel.get(key=self._spec.receiver_index)
        return plan.version, self._buckets(plan)

    def _buckets(self, plan: BucketPlan) -> Buckets:
        import ray
        import torch

        for slots in plan.buckets:
            [ref] = self._spec.channel.get(key=self._spec.receiver_index)
            with warnings.catch_warnings():
                # A read-only view of the object store; the receiver hook's contract says copy, never write.
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                flat = torch.from_numpy(ray.get(ref))
            del ref
            yield unpack_bucket(flat, slots, plan.aliases)


class CudaIpcTransport(WeightTransport):
    """Buckets packed on the sender's GPU, handed to receivers on the same GPU as CUDA IPC handles. Untested on
    GPU: the bucket protocol it shares with ``ObjectStoreTransport`` is what the CPU tests cover."""

    wants_device_tensors = True
    WINDOW = 2
    """Buckets alive on the sender's GPU at once: one being read by the receivers, the next being packed."""

    def __init__(self, spec: CudaIpcSpec):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("weight sync method cuda_ipc needs a CUDA device in every participant; "
                               "use object_store on CPU")
        self._spec = spec
        self._fan_out = _ChannelFanOut(spec.channel, spec.num_receivers)
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._gpu = str(torch.cuda.get_device_properties(self._device).uuid)

    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        plan = plan_buckets(state_dict, self._spec.bucket_bytes, version)
        self._fan_out.to_all(plan)
        alive: deque[tuple[int, torch.Tensor]] = deque()
        for index, (slots, size) in enumerate(zip(plan.buckets, plan.sizes)):
            if len(alive) == self.WINDOW:
                self._acknowledged(*alive.popleft())
            flat = pack_bucket(state_dict, slots, size, self._device)
            torch.cuda.current_stream(self._device).synchronize()  # packed before another process reads it
            self._fan_out.to_all((index, self._gpu, reduce_tensor(flat)))
            alive.append((index, flat))
        while alive:
            self._acknowledged(*alive.popleft())

    def _acknowledged(self, index: int, flat: torch.Tensor) -> None:
        """Wait until every receiver has copied bucket ``index`` (``flat``); the caller's drop then frees it."""
        for receiver in range(self._spec.num_receivers):
            acknowledged = self._spec.channel.get(key=("ack", receiver), timeout=self._spec.timeout_s)
            if acknowledged != index:
                raise RuntimeError(f"weight sync over CUDA IPC: receiver {receiver} acknowledged bucket "
                                   f"{acknowledged}, {index} was due")

    def receive_stream(self) -> tuple[int, Buckets]:
        plan: BucketPlan = self._spec.channel.get(key=self._spec.receiver_index)
        return plan.version, self._buckets(plan)

    def _buckets(self, plan: BucketPlan) -> Buckets:
        import torch

        for expected, slots in enumerate(plan.buckets):
            index, gpu, (rebuild, args) = self._spec.channel.get(key=self._spec.receiver_index)
            if index != expected:
                raise RuntimeError(f"weight sync over CUDA IPC: bucket {index} arrived, {expected} was due")
            if gpu != self._gpu:
                raise RuntimeError(f"weight sync method cuda_ipc needs the sender and receiver on one GPU: the "
                                   f"sender is on {gpu}, this receiver on {self._gpu}; use object_store or broadcast")
            # The handle names the sender's device index; each rank sees its one GPU as its own current device.
            args = list(args)
            args[6] = self._device.index
            flat = rebuild(*args)
            yield unpack_bucket(flat, slots, plan.aliases)
            torch.cuda.synchronize(self._device)  # the receiver's copies out of the bucket have finished
            del flat
            self._spec.channel.put(index, key=("ack", self._spec.receiver_index))


class BroadcastTransport(WeightTransport):
    """A gloo/nccl group of its own: the plan (pickled), then one broadcast per bucket."""

    def __init__(self, spec: BroadcastSpec):
        import torch.distributed as dist

        self._spec = spec
        self._device = "cpu" if spec.backend == "gloo" else "cuda"
        timeout = timedelta(seconds=spec.timeout_s)
        # Its own store and group: torch.distributed allows one default group per process, and the
        # actor's training group must not be touched by the sync (nor the sync wait on it).
        self._store = dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size,
                                    is_master=spec.rank == 0, timeout=timeout)
        if spec.backend == "gloo":
            self._group = dist.ProcessGroupGloo(self._store, spec.rank, spec.world_size, timeout)
        else:
            self._group = dist.ProcessGroupNCCL(self._store, spec.rank, spec.world_size)

    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        plan = plan_buckets(state_dict, self._spec.bucket_bytes, version)
        self._broadcast_header(pickle.dumps(plan))
        for slots, size in zip(plan.buckets, plan.sizes):
            self._broadcast(pack_bucket(state_dict, slots, size, self._device))

    def receive_stream(self) -> tuple[int, Buckets]:
        plan: BucketPlan = pickle.loads(self._broadcast_header(None))
        return plan.version, self._buckets(plan)

    def _buckets(self, plan: BucketPlan) -> Buckets:
        import torch

        for slots, size in zip(plan.buckets, plan.sizes):
            flat = self._broadcast(torch.empty(size, dtype=torch.uint8, device=self._device))
            yield unpack_bucket(flat, slots, plan.aliases)

    def close(self) -> None:
        self._group = None
        self._store = None

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([tensor], options).wait()
        return tensor

    def _broadcast_header(self, header: bytes | None) -> bytes:
        import torch

        length = torch.tensor([len(header) if header is not None else 0], dtype=torch.int64, device=self._device)
        self._broadcast(length)
        if header is not None:
            body = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self._device)
        else:
            body = torch.empty(int(length.item()), dtype=torch.uint8, device=self._device)
        return bytes(self._broadcast(body).cpu().numpy())

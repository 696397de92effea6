"""Weight sync: the actor's new weights to the rollout (and inference) groups, with a version.

The interface is ``WeightTransport``: ``send(state_dict, version)`` on the sender rank,
``receive() -> (state_dict, version)`` on each receiver rank. Two transports:

- ``ObjectStoreTransport`` (collocated): the sender puts the state dict in Ray's object store once;
  each receiver gets it as numpy views of that shared memory (no copy until it loads them).
- ``BroadcastTransport`` (disaggregated): one ``torch.distributed`` broadcast over a gloo (CPU) or
  nccl (GPU) group made of the sender rank and every receiver rank, on its own port, apart from
  each group's own process group, and torn down by ``close``.

``WeightSync`` drives them from the driver: it opens a transport on rank 0 of the sender group and
on every receiver rank, and ``sync(version)`` calls the workers' ``get_weights`` / ``set_weights``.
"""

from __future__ import annotations

import pickle
import uuid
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Union

import numpy as np
import ray

from rlinf_search.scheduler.channel import Channel
from rlinf_search.scheduler.worker_group import WorkerGroup, wait_all

if TYPE_CHECKING:
    import torch

METHODS = ("auto", "object_store", "broadcast")
_ALIGN = 64  # bytes; every tensor starts aligned in a bucket so it can be viewed as its dtype


class WeightTransport(ABC):
    """Moves a state dict from one sender rank to every receiver rank, with a version number."""

    @abstractmethod
    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """On the sender: deliver ``state_dict`` at ``version`` to every receiver."""

    @abstractmethod
    def receive(self) -> tuple[dict[str, torch.Tensor], int]:
        """On a receiver: wait for the next state dict; return it and its version."""

    def close(self) -> None:
        """Release what the transport holds (sockets, process groups)."""


@dataclass(frozen=True)
class ObjectStoreSpec:
    """How one participant opens an ``ObjectStoreTransport`` (picklable: built on the driver)."""

    channel: Channel
    """Carries one object-store reference per receiver per sync."""
    num_receivers: int
    receiver_index: int | None
    """This participant's index among the receivers; None on the sender."""

    def open(self) -> ObjectStoreTransport:
        return ObjectStoreTransport(self)


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


TransportSpec = Union[ObjectStoreSpec, BroadcastSpec]


class ObjectStoreTransport(WeightTransport):
    """One ``ray.put`` per version; receivers read it from shared memory (same node) or via Ray."""

    def __init__(self, spec: ObjectStoreSpec):
        self._spec = spec

    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        arrays, dtypes, converted = {}, {}, {}
        for name, tensor in state_dict.items():
            # A tensor listed under two names (a tied LM head) becomes one array, which pickle stores once.
            if id(tensor) not in converted:
                converted[id(tensor)] = _to_numpy(tensor)
            arrays[name], dtypes[name] = converted[id(tensor)]
        ref = ray.put((version, arrays, dtypes))
        for index in range(self._spec.num_receivers):
            self._spec.channel.put([ref], key=index)  # in a list, so the reference travels, not the data

    def receive(self) -> tuple[dict[str, torch.Tensor], int]:
        [ref] = self._spec.channel.get(key=self._spec.receiver_index)
        version, arrays, dtypes = ray.get(ref)
        return {name: _from_numpy(array, dtypes[name]) for name, array in arrays.items()}, version


class BroadcastTransport(WeightTransport):
    """A gloo/nccl group of its own: a header (version, names, dtypes, shapes), then flat buckets."""

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
        import torch

        meta = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in state_dict.items()]
        self._broadcast_header(pickle.dumps((version, meta)))
        for bucket, size in _buckets(meta, self._spec.bucket_bytes):
            flat = torch.empty(size, dtype=torch.uint8, device=self._device)
            for name, offset, nbytes in bucket:
                tensor = state_dict[name].detach().to(self._device).contiguous()
                flat[offset:offset + nbytes].copy_(tensor.reshape(-1).view(torch.uint8))
            self._broadcast(flat)

    def receive(self) -> tuple[dict[str, torch.Tensor], int]:
        import torch

        version, meta = pickle.loads(self._broadcast_header(None))
        dtypes = {name: getattr(torch, dtype) for name, dtype, _ in meta}
        shapes = {name: shape for name, _, shape in meta}
        state_dict = {}
        for bucket, size in _buckets(meta, self._spec.bucket_bytes):
            flat = self._broadcast(torch.empty(size, dtype=torch.uint8, device=self._device))
            for name, offset, nbytes in bucket:
                state_dict[name] = flat[offset:offset + nbytes].view(dtypes[name]).view(shapes[name])
        return state_dict, version

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


class WeightSync:
    """Driver side: rank 0 of ``sender`` to every rank of ``receivers``; usable as a context manager.

    ``method``: ``object_store``, ``broadcast``, or ``auto``: the object store when every receiver rank
    is on a device of the sender group (collocated), a broadcast otherwise (disaggregated).
    """

    def __init__(self, sender: WorkerGroup, receivers: Sequence[WorkerGroup], *, method: str = "auto",
                 timeout_s: float = 600.0, bucket_bytes: int = 256 * 2**20):
        if method not in METHODS:
            raise ValueError(f"weight sync method must be one of {', '.join(METHODS)}, got {method!r}")
        self._sender = sender
        self._receivers = list(receivers)
        self._timeout_s = timeout_s
        self._id = f"{sender.name}->{','.join(g.name for g in self._receivers)}:{uuid.uuid4().hex[:8]}"
        self.method = self._choose(method)
        """The transport in use: ``object_store`` or ``broadcast``."""
        self.version: int | None = None
        """The last version every receiver loaded."""
        self._channel: Channel | None = None
        try:
            self._open(bucket_bytes)
        except BaseException:
            if self._channel is not None:
                self._channel.close()
            raise

    def sync(self, version: int) -> None:
        """Send the sender's ``get_weights()`` to every receiver's ``set_weights(state_dict, version)``."""
        self.start(version).wait()

    def start(self, version: int) -> PendingSync:
        """``sync`` without waiting: the calls are sent and the sender's later calls queue behind its send, so a
        caller can go on using the sender while receivers load (an engine that first lets its requests in flight
        finish, for one). ``wait()`` on the result before the next ``start``."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"weight sync {self._id}: version {version} does not advance past {self.version}")
        # Every sender rank joins: with sharded weights, gathering them is a collective (rank 0 sends).
        calls = [self._sender.call("_weight_sync_send", self._id, version)]
        calls += [group.call("_weight_sync_receive", self._id) for group in self._receivers]
        return PendingSync(self, version, calls)

    def _loaded(self, version: int, results: list) -> None:
        loaded = {v for versions in results[1:] for v in versions}
        if loaded != {version}:
            raise RuntimeError(f"weight sync {self._id}: receivers loaded versions {sorted(loaded)}, not {version}")
        self.version = version

    def close(self) -> None:
        """Tear down the transports (and the broadcast group's sockets) on every participant."""
        calls = [self._sender.call_on(0, "_weight_sync_close", self._id)]
        calls += [group.call("_weight_sync_close", self._id) for group in self._receivers]
        wait_all(calls, self._timeout_s)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _choose(self, method: str) -> str:
        if method != "auto":
            return method
        sender_devices = set(self._sender.placement.devices)
        collocated = all(set(g.placement.devices) <= sender_devices for g in self._receivers)
        return "object_store" if collocated else "broadcast"

    def _open(self, bucket_bytes: int) -> None:
        receiver_ranks = [(group, rank) for group in self._receivers for rank in range(group.world_size)]
        if self.method == "object_store":
            self._channel = Channel.create(f"weights {self._id}")
            specs: list[TransportSpec] = [ObjectStoreSpec(self._channel, len(receiver_ranks), None)]
            specs += [ObjectStoreSpec(self._channel, len(receiver_ranks), i) for i in range(len(receiver_ranks))]
        else:
            cluster = self._sender.cluster
            node = self._sender.placement.ranks[0].node_rank
            backend = "gloo" if cluster.device_kind == "cpu" else "nccl"
            common = dict(master_addr=cluster.node_address(node), master_port=cluster.free_port(node),
                          world_size=1 + len(receiver_ranks), backend=backend, timeout_s=self._timeout_s,
                          bucket_bytes=bucket_bytes)
            specs = [BroadcastSpec(rank=i, **common) for i in range(1 + len(receiver_ranks))]
        # All at once: the broadcast group's rendezvous waits for every participant.
        calls = [self._sender.call_on(0, "_weight_sync_open", self._id, specs[0])]
        calls += [group.call_on(rank, "_weight_sync_open", self._id, spec)
                  for (group, rank), spec in zip(receiver_ranks, specs[1:])]
        wait_all(calls, self._timeout_s)


class PendingSync:
    """A weight sync on its way (``WeightSync.start``)."""

    def __init__(self, sync: WeightSync, version: int, calls: list):
        self._sync, self.version, self._calls = sync, version, calls

    def wait(self) -> None:
        """Return once every receiver has loaded the version (raises as ``WeightSync.sync`` would)."""
        self._sync._loaded(self.version, wait_all(self._calls, self._sync._timeout_s))


def _buckets(meta: list[tuple[str, str, tuple]], bucket_bytes: int) -> list[tuple[list[tuple[str, int, int]], int]]:
    """Pack tensors, in order, into buckets: ``([(name, offset, nbytes)], bucket size)``. Sender and
    receivers compute the same layout from the header."""
    import torch

    buckets: list[tuple[list[tuple[str, int, int]], int]] = []
    entries: list[tuple[str, int, int]] = []
    size = 0
    for name, dtype, shape in meta:
        nbytes = int(np.prod(shape, dtype=np.int64)) * getattr(torch, dtype).itemsize
        if entries and size + nbytes > bucket_bytes:
            buckets.append((entries, size))
            entries, size = [], 0
        entries.append((name, size, nbytes))
        size += -(-nbytes // _ALIGN) * _ALIGN
    if entries:
        buckets.append((entries, size))
    return buckets


def _to_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, str]:
    """A numpy view of a CPU copy (no copy for CPU tensors); dtypes numpy lacks (bfloat16) travel as
    same-width integers and are viewed back on arrival."""
    import torch

    tensor = tensor.detach().cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    try:
        return tensor.numpy(), dtype
    except TypeError:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
        return tensor.view(width).numpy(), dtype


def _from_numpy(array: np.ndarray, dtype: str) -> torch.Tensor:
    import torch

    with warnings.catch_warnings():
        # The array is a read-only view of the object store; set_weights' contract says copy, never write.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    target = getattr(torch, dtype)
    return tensor if tensor.dtype == target else tensor.view(target)

"""``Worker``: the base class of every process a ``WorkerGroup`` runs (one instance per rank).

The worker-side API is deliberately small: ``rank``, ``world_size``, ``local_rank``, ``group_name``,
``device`` and ``device_slot`` (read from the environment the group set when it started the
process), ``init_process_group()``, and the hooks for weight sync (``get_weights`` on the sender,
``set_weights`` or ``set_weight_buckets`` on receivers). Subclasses need not call ``super().__init__()``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rlinf_search.scheduler.weight_transports import Buckets, TransportSpec, WeightTransport
    from rlinf_search.scheduler.worker_group import WorkerGroup


class Worker:
    """Subclass, add methods, then ``MyWorker.create_group(*args).launch(cluster, placement, name=...)``."""

    @classmethod
    def create_group(cls, *init_args: Any, **init_kwargs: Any) -> WorkerGroup:
        """A group of this worker; every rank is constructed with ``init_args``/``init_kwargs``."""
        from rlinf_search.scheduler.worker_group import WorkerGroup

        return WorkerGroup(cls, init_args, init_kwargs)

    @property
    def rank(self) -> int:
        return _env_int("RANK")

    @property
    def world_size(self) -> int:
        return _env_int("WORLD_SIZE")

    @property
    def local_rank(self) -> int:
        """Rank among this group's ranks on the same node."""
        return _env_int("LOCAL_RANK")

    @property
    def group_name(self) -> str:
        return _env("RLINF_GROUP_NAME")

    @property
    def device_slot(self) -> int:
        """This rank's device on its node: the GPU index, or the CPU slot."""
        if "RLINF_CPU_SLOT" in os.environ:
            return _env_int("RLINF_CPU_SLOT")
        return _env_int("CUDA_VISIBLE_DEVICES")

    @property
    def device(self) -> str:
        """What to move tensors to: ``cpu``, or ``cuda:0`` (the rank sees only its own GPU)."""
        _env("RLINF_GROUP_NAME")  # outside a group there is no device to name
        return "cpu" if "RLINF_CPU_SLOT" in os.environ else "cuda:0"

    def init_process_group(self, *, timeout_s: float = 600.0, cpu_collectives: bool = False) -> None:
        """Join ``torch.distributed`` with the group's other ranks (gloo on CPU, nccl on GPU).
        ``cpu_collectives``: on GPU, also gloo for CPU tensors (FSDP2 with its shards in CPU memory reduces
        their gradient norm there).

        Every rank must call it at once (``launch(..., init_process_group=True)`` does); the
        rendezvous is ``MASTER_ADDR:MASTER_PORT``, a port the group reserved on rank 0's node.
        """
        import torch.distributed as dist

        if dist.is_initialized():
            return
        backend = "gloo" if self.device == "cpu" else "cpu:gloo,cuda:nccl" if cpu_collectives else "nccl"
        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=timeout_s))

    def get_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """Sender hook for ``WeightSync``: the full state dict to send. Called on rank 0, and on every rank
        when ``weights_need_every_rank()`` (sharded weights are gathered by a collective). ``on_device``: the
        transport packs its buckets on this rank's device (``cuda_ipc``), so tensors left there save a host copy."""
        raise NotImplementedError(f"{type(self).__name__} sends weights: implement get_weights()")

    def weights_need_every_rank(self) -> bool:
        """Sender hook: True when ``get_weights`` is a collective (FSDP's gather), so every rank of the
        sending group must call it at each sync; rank 0 sends what it returns."""
        return False

    def set_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Receiver hook for ``WeightSync``: load ``state_dict``, the sender's weights at ``version``.
        Tensors from the object store are read-only views of shared memory: copy them in (as
        ``load_state_dict`` does), never write to them."""
        raise NotImplementedError(f"{type(self).__name__} receives weights: implement set_weights()")

    def set_weight_buckets(self, buckets: Buckets, version: int) -> None:
        """Receiver hook for ``WeightSync``: load the sender's weights at ``version`` bucket by bucket, each a
        partial state dict of read-only views valid until the next is taken, so the receiver never holds the
        whole model twice. Take every bucket. The default gathers them all and calls ``set_weights``."""
        from rlinf_search.scheduler.weight_buckets import collect

        self.set_weights(collect(buckets), version)

    # Called by WeightSync from the driver; not for user code.

    def _weight_sync_open(self, sync_id: str, spec: TransportSpec) -> None:
        self._transports()[sync_id] = spec.open()

    def _weight_sync_send(self, sync_id: str, version: int) -> None:
        transport = self._transports().get(sync_id)  # rank 0 only
        if transport is None and not self.weights_need_every_rank():
            return
        on_device = transport is not None and transport.wants_device_tensors
        weights = self.get_weights(on_device=True) if on_device else self.get_weights()
        if transport is not None:
            transport.send(weights, version)

    def _weight_sync_receive(self, sync_id: str) -> int:
        version, buckets = self._transports()[sync_id].receive_stream()
        self.set_weight_buckets(buckets, version)
        if next(buckets, None) is not None:  # the sender would wait for the rest forever
            raise RuntimeError(f"{type(self).__name__}.set_weight_buckets returned before taking every bucket")
        return version

    def _weight_sync_close(self, sync_id: str) -> None:
        transport = self._transports().pop(sync_id, None)
        if transport is not None:
            transport.close()

    def _transports(self) -> dict[str, WeightTransport]:
        # Kept on the instance (not in __init__), so subclasses owe the base class nothing.
        return self.__dict__.setdefault("_rlinf_weight_transports", {})


def _env(name: str) -> str:
    try:
        return os.environ[name]
    except KeyError:
        raise RuntimeError(f"{name} is not set: this Worker was not started by a WorkerGroup "
                           "(use MyWorker.create_group(...).launch(cluster, placement))") from None


def _env_int(name: str) -> int:
    return int(_env(name))

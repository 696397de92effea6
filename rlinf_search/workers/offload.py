"""Freeing a trainer's device memory between phases: weights, gradients and optimizer state swapped out to
host memory and back.

Collocated components time-share a device: while the rollout engine generates, the actor's weights,
gradients and Adam moments would hold device memory the engine's KV cache needs. Reassigning
``param.data`` does not free that memory when something else holds the same storage (FSDP2's sharded
buffer behind each DTensor, megatron-core's contiguous parameter and gradient buffers, whose views the
parameters are), so the swap works on storages instead: each one is copied to a host buffer and resized
to zero bytes, and on the way back resized and refilled. Every tensor and view keeps its identity and
its place in every buffer; nothing is re-pointed, and the freed bytes go back to the allocator (and to
the engine, after ``torch.cuda.empty_cache``).

Host buffers are pinned on a GPU machine (fast, asynchronous copies) and reused from one offload to the
next: pinning gigabytes is slow, and the same sizes recur every step.

On a CPU-only machine the device and the host are the same memory and an offload does nothing;
``force=True`` runs the swap anyway, which is how it is tested here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

CATEGORIES = ("weights", "grads", "optimizer")


@dataclass(frozen=True)
class OffloadConfig:
    """What leaves the device after the actor's update (``actor.offload_*``)."""

    weights: bool = False
    """``actor.offload_weight``: parameters and buffers, the reference model's included."""
    grads: bool = False
    """``actor.offload_grad``: gradients left from the last backward pass (megatron-core's gradient buffer)."""
    optimizer: bool = False
    """``actor.offload_optimizer``: the optimizer's state: Adam moments, and the fp32 main weights of
    megatron-core's distributed optimizer."""

    @property
    def any(self) -> bool:
        return self.weights or self.grads or self.optimizer

    def selected(self) -> tuple[str, ...]:
        return tuple(name for name in CATEGORIES if getattr(self, name))


@dataclass
class OffloadTensors:
    """The tensors an offload may move, by category; read afresh at each offload (gradients and optimizer
    state come and go). A tensor whose storage is listed twice is moved once."""

    weights: list[torch.Tensor] = field(default_factory=list)
    """Parameters and buffers (the reference model's too)."""
    grads: list[torch.Tensor] = field(default_factory=list)
    """Gradients: ``param.grad``, or megatron-core's ``param.main_grad`` views of its fp32 buffer."""
    optimizer: list[torch.Tensor] = field(default_factory=list)
    """Optimizer state tensors, and any main-weight copies the optimizer keeps."""


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (what holds its memory); any other tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def module_tensors(modules: Iterable[torch.nn.Module], optimizer: torch.optim.Optimizer | None) -> OffloadTensors:
    """What torch modules and a torch optimizer hold. FSDP2 modules are resharded first: after a forward
    without backward the root keeps its gathered weights, which no sharded parameter points at."""
    from torch.distributed.fsdp import FSDPModule

    out = OffloadTensors()
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()
        for param in module.parameters():
            out.weights.append(param)
            if param.grad is not None:
                out.grads.append(param.grad)
        out.weights.extend(module.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            out.optimizer.extend(v for v in state.values() if torch.is_tensor(v))
    return out


@torch.no_grad()
def move_module(module: torch.nn.Module, device: torch.device | str) -> None:
    """Parameters and buffers of a plain module to ``device``, the ``Parameter`` objects kept. Frees the old
    memory only when nothing else holds it: right for an engine's HF model (weights can still be loaded
    while away), wrong under FSDP2 or megatron-core's buffers (use ``Offloader``)."""
    for param in module.parameters():  # tied weights are one Parameter: moved once, still tied
        param.data = param.data.to(device)
    for sub in module.modules():
        for name, buffer in list(sub.named_buffers(recurse=False)):
            setattr(sub, name, buffer.to(device))


class Offloader:
    """Swaps the categories ``config`` selects between ``device`` and host memory.

    ``offload()`` after an update, ``onload()`` before the next use; both are idempotent, and ``on_device``
    brings some categories back for a while (the weights, for a weight sync).
    """

    def __init__(self, config: OffloadConfig, tensors: Callable[[], OffloadTensors], *,
                 device: torch.device | str, offload_device: torch.device | str = "cpu"):
        self.config = config
        self.tensors = tensors
        self.device = torch.device(device)
        self.offload_device = torch.device(offload_device)
        # Category -> (storage, host copy) pairs; None: marked away with nothing to move (device is the host).
        self._away: dict[str, list[tuple[torch.UntypedStorage, torch.Tensor]] | None] = {}
        self._free_host: dict[int, list[torch.Tensor]] = {}  # host buffers by size, kept for the next offload

    @classmethod
    def for_modules(cls, config: OffloadConfig, modules: list[torch.nn.Module],
                    optimizer: torch.optim.Optimizer | None, *, device: torch.device | str) -> Offloader:
        return cls(config, lambda: module_tensors(modules, optimizer), device=device)

    @property
    def offloaded(self) -> bool:
        """True while any selected category is away."""
        return bool(self._away)

    @torch.no_grad()
    def offload(self, *, force: bool = False) -> None:
        """Swap out every selected category still on the device; ``force``: even when the device is the host."""
        self._offload(self.config.selected(), force=force)

    def _offload(self, categories: Iterable[str], *, force: bool) -> None:
        pending = [name for name in categories if name not in self._away]
        if pending and _same_device(self.device, self.offload_device) and not force:
            self._away.update({name: None for name in pending})  # already where offloaded state would go
            pending = []
        if pending:
            tensors = self.tensors()
            self._swap_out({name: self._storages(getattr(tensors, name)) for name in pending})
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand freed and cached blocks back, so a collocated engine can use them

    @torch.no_grad()
    def onload(self, categories: Iterable[str] | None = None) -> None:
        """Bring back ``categories`` (all that are away by default)."""
        names = [name for name in (CATEGORIES if categories is None else categories) if name in self._away]
        swapped = [pair for name in names for pair in self._away[name] or []]
        for storage, host in swapped:
            storage.resize_(host.numel())
            _bytes(storage).copy_(host, non_blocking=True)
        self._synchronize()
        for storage, host in swapped:
            self._free_host.setdefault(host.numel(), []).append(host)
        for name in names:
            del self._away[name]

    @contextlib.contextmanager
    def on_device(self, *categories: str):
        """``categories`` on the device inside the block, and away again after it if they were away before."""
        away = [name for name in categories if name in self._away]
        swapped = any(self._away[name] is not None for name in away)  # a forced swap is forced again
        self.onload(away)
        try:
            yield
        finally:
            self._offload(away, force=swapped)

    def _storages(self, tensors: list[torch.Tensor]) -> list[torch.UntypedStorage]:
        out = []
        for tensor in tensors:
            local = local_shard(tensor)
            if not _same_device(local.device, self.device):
                continue  # kept elsewhere already (FSDP2's CPU offload, a CPU step counter)
            out.append(local.untyped_storage())
        return out

    def _swap_out(self, chosen: dict[str, list[torch.UntypedStorage]]) -> None:
        seen: set[int] = set()
        plan: dict[str, list[torch.UntypedStorage]] = {}
        for name, storages in chosen.items():
            plan[name] = []
            for storage in storages:
                if storage.nbytes() == 0 or storage.data_ptr() in seen:
                    continue  # empty, already away, or shared with a tensor listed before
                if not storage.resizable():
                    raise RuntimeError(f"offload of {name}: a storage of {storage.nbytes()} bytes is not owned by "
                                       "torch's allocator (memory-mapped?) and cannot be freed; nothing was moved")
                seen.add(storage.data_ptr())
                plan[name].append(storage)
        # Every copy finishes before any storage is freed: a failure part way loses nothing.
        copies = {name: [(s, self._host_copy(s)) for s in storages] for name, storages in plan.items()}
        self._synchronize()
        for name, pairs in copies.items():
            for storage, _ in pairs:
                storage.resize_(0)
            self._away[name] = pairs

    def _host_copy(self, storage: torch.UntypedStorage) -> torch.Tensor:
        size = storage.nbytes()
        free = self._free_host.get(size)
        host = free.pop() if free else torch.empty(size, dtype=torch.uint8, device=self.offload_device,
                                                   pin_memory=self.device.type == "cuda"
                                                   and self.offload_device.type == "cpu")
        host.copy_(_bytes(storage), non_blocking=True)
        return host

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The whole storage as a flat uint8 tensor (a view: writing it writes the storage)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` name the same device for a rank that sees one GPU."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)

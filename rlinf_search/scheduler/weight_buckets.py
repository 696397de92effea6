"""The bucket protocol every weight transport speaks: a plan sent first, then flat byte buckets one at a time.

The sender lays the state dict out in buckets of about ``bucket_bytes`` (``plan_buckets``): each tensor at an
aligned offset of one bucket, in the state dict's order. A tensor listed under two names (a tied LM head is the
embedding) is laid out once and its other names travel as aliases. The plan goes to every receiver first; then
each bucket is packed into one flat ``uint8`` tensor (``pack_bucket``), moved by the transport (an object-store
reference, a broadcast, a CUDA IPC handle) and viewed back as named tensors on arrival (``unpack_bucket``), so a
receiver can load bucket k while bucket k+1 is on its way and never holds the whole model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ALIGN = 64
"""Bytes: every tensor starts aligned in its bucket, so it can be viewed as its dtype."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in its bucket."""

    name: str
    """Its name in the sender's state dict (Hugging Face names)."""
    dtype: str
    """``torch`` dtype name without the prefix (``bfloat16``)."""
    shape: tuple[int, ...]
    """Its shape."""
    offset: int
    """Byte offset in the bucket (a multiple of ``ALIGN``)."""
    nbytes: int
    """Its size in bytes."""


@dataclass(frozen=True)
class BucketPlan:
    """The layout of one sync, sent to every receiver before the first bucket."""

    version: int
    """The weight version these buckets carry."""
    buckets: tuple[tuple[TensorSlot, ...], ...]
    """The tensors of each bucket, in sending order."""
    sizes: tuple[int, ...]
    """Each bucket's size in bytes."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """A name whose tensor is another name's (a tied weight) -> that name, which is sent."""

    @property
    def nbytes(self) -> int:
        """Bytes sent in all: each tied tensor once."""
        return sum(self.sizes)


def plan_buckets(state_dict: Mapping[str, torch.Tensor], bucket_bytes: int, version: int) -> BucketPlan:
    """Lay ``state_dict`` out in buckets of about ``bucket_bytes`` (a tensor larger than that gets a bucket of its
    own). A tensor that is the same object, or the same memory with the same dtype and shape, as one listed
    earlier becomes an alias of it."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[tuple[TensorSlot, ...]] = []
    sizes: list[int] = []
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    slots: list[TensorSlot] = []
    size = 0
    for name, tensor in state_dict.items():
        key = _identity(tensor)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        nbytes = tensor.numel() * tensor.element_size()
        if slots and size + nbytes > bucket_bytes:
            buckets.append(tuple(slots))
            sizes.append(size)
            slots, size = [], 0
        slots.append(TensorSlot(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), size, nbytes))
        size += -(-nbytes // ALIGN) * ALIGN
    if slots:
        buckets.append(tuple(slots))
        sizes.append(size)
    return BucketPlan(version, tuple(buckets), tuple(sizes), aliases)


def pack_bucket(state_dict: Mapping[str, torch.Tensor], slots: tuple[TensorSlot, ...], size: int,
                device: torch.device | str = "cpu", out: torch.Tensor | None = None) -> torch.Tensor:
    """The bucket's tensors copied into one flat ``uint8`` tensor of ``size`` bytes on ``device`` (into ``out``,
    a flat ``uint8`` tensor of at least ``size`` bytes, when given)."""
    import torch

    flat = torch.empty(size, dtype=torch.uint8, device=device) if out is None else out
    for slot in slots:
        tensor = state_dict[slot.name].detach()
        if tensor.nbytes:
            flat[slot.offset:slot.offset + slot.nbytes].copy_(tensor.contiguous().reshape(-1).view(torch.uint8))
    return flat


def unpack_bucket(flat: torch.Tensor, slots: tuple[TensorSlot, ...],
                  aliases: Mapping[str, str] = {}) -> dict[str, torch.Tensor]:
    """Views of ``flat`` as the bucket's named tensors (no copy), with every alias of them under its own name."""
    import torch

    out = {}
    for slot in slots:
        out[slot.name] = flat[slot.offset:slot.offset + slot.nbytes].view(getattr(torch, slot.dtype)).view(slot.shape)
    for alias, source in aliases.items():
        if source in out:
            out[alias] = out[source]
    return out


def collect(buckets: Iterator[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every bucket's tensors in one state dict (a receiver that loads the whole model at once)."""
    state_dict: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        state_dict.update(bucket)
    return state_dict


def _identity(tensor: torch.Tensor) -> tuple:
    """What makes two entries the same tensor: the same memory seen with the same dtype, shape and strides.
    Empty tensors share no memory that matters, so each counts on its own."""
    if tensor.numel() == 0 or tensor.device.type == "meta":
        return ("object", id(tensor))
    return (tensor.device.type, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))

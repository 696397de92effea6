"""Loading a weight sync into a torch module bucket by bucket: what the HF engine and the inference group share.

A sync arrives as a state dict or as buckets (partial state dicts, ``scheduler.weight_buckets``). Each tensor is
copied into the module's own parameter or buffer as its bucket arrives (cast to its dtype, moved to its device),
so a receiver never holds the whole incoming model beside its own. The check is ``load_state_dict``'s strict one:
every name known, every shape equal, every weight of the module loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

Weights = Mapping[str, torch.Tensor] | Iterable[Mapping[str, torch.Tensor]]
"""A state dict, or buckets of one in any order (each a partial state dict, taken one at a time)."""


def weight_buckets(weights: Weights) -> Iterable[Mapping[str, torch.Tensor]]:
    """``weights`` as buckets: a state dict is one bucket."""
    return [weights] if isinstance(weights, Mapping) else weights


@torch.no_grad()
def load_weight_buckets(module: torch.nn.Module, weights: Weights) -> int:
    """Copy every tensor of ``weights`` into ``module``'s state in place; return how many tensors were copied (a
    tied weight listed under two names is copied once). Raises ``ValueError`` for an unknown name, a wrong shape
    or a weight never sent; the tensors before it are loaded by then, as with ``load_state_dict``."""
    targets = module.state_dict(keep_vars=True)
    covered: set[str] = set()
    copied: set[int] = set()
    for bucket in weight_buckets(weights):
        for name, tensor in bucket.items():
            target = targets.get(name)
            if target is None:
                raise ValueError(f"weight sync: {name!r} is not a weight of {type(module).__name__} (names as in the "
                                 "Hugging Face model are expected)")
            tensor = torch.as_tensor(tensor)
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"weight sync: {name!r} has shape {tuple(tensor.shape)}, the model's is "
                                 f"{tuple(target.shape)}")
            covered.add(name)
            if id(target) in copied:  # a tied weight: the same parameter under another name
                continue
            target.copy_(tensor)
            copied.add(id(target))
    missing = [name for name, target in targets.items() if name not in covered and id(target) not in copied]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(f"weight sync: {len(missing)} weight(s) of {type(module).__name__} were not sent: {shown}")
    return len(copied)

"""Moving a model's weights, gradients and optimizer state off its device between phases, and back.

Collocated components time-share a device: while the rollout engine generates, the actor's weights,
gradients and Adam moments would hold device memory the engine's KV cache needs (and the engine's
weights are in the way while the actor trains). Every move is ``tensor.to(device)``, which returns
the tensor itself when it is already there, so on a CPU-only machine an offload to ``cpu`` copies
nothing. ``copy=True`` forces fresh storage even then: it runs the same bookkeeping (parameters
re-pointed, gradients parked, optimizer entries replaced) where no second device exists, which is
how the round trip is tested on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OffloadConfig:
    """What leaves the device after the actor's update (``actor.offload_*``)."""

    weights: bool = False
    """``actor.offload_weight``: parameters and buffers, the reference model's included."""
    grads: bool = False
    """``actor.offload_grad``: gradients left from the last backward pass."""
    optimizer: bool = False
    """``actor.offload_optimizer``: the optimizer's per-parameter state (Adam moments)."""

    @property
    def any(self) -> bool:
        return self.weights or self.grads or self.optimizer


@torch.no_grad()
def move_module(module: torch.nn.Module, device: torch.device | str, *, copy: bool = False) -> None:
    """Parameters and buffers of ``module`` to ``device``, in place: the ``Parameter`` objects stay the
    same (only their data moves), so an optimizer that holds them needs no update. Gradients stay
    where they are (see ``Offloader`` for why they must be moved apart)."""
    for param in module.parameters():  # tied weights are one Parameter: moved once, still tied
        param.data = param.data.to(device, copy=copy)
    for sub in module.modules():
        for name, buffer in list(sub.named_buffers(recurse=False)):
            setattr(sub, name, buffer.to(device, copy=copy))


class Offloader:
    """Moves what ``config`` selects between the compute ``device`` and ``offload_device``.

    ``offload()`` after an update, ``onload()`` before the next use; both are idempotent. A gradient
    must live on its parameter's device (torch refuses the assignment otherwise), so gradients are
    parked in a side table while away, and put back after the weights return.
    """

    def __init__(self, config: OffloadConfig, *, modules: list[torch.nn.Module],
                 optimizer: torch.optim.Optimizer | None, device: torch.device | str,
                 offload_device: torch.device | str = "cpu"):
        self.config = config
        self.modules = modules
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.offload_device = torch.device(offload_device)
        self.offloaded = False
        """True between ``offload()`` and ``onload()``."""
        self._parked_grads: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._moved_state: list[tuple[dict, str]] = []  # optimizer entries that left, to bring back exactly those

    def offload(self, *, copy: bool = False) -> None:
        if self.offloaded or not self.config.any:
            return
        self.offloaded = True
        if _same_device(self.device, self.offload_device) and not copy:
            return  # already where offloaded state would go: nothing to copy
        if self.config.grads or self.config.weights:
            # Weights leaving without their gradients: the gradients wait on the device, parked.
            target = self.offload_device if self.config.grads else self.device
            for param in self._parameters():
                if param.grad is not None:
                    self._parked_grads[param] = param.grad.to(target, copy=copy and self.config.grads)
                    param.grad = None
        if self.config.optimizer and self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    # Only what sits on the compute device: a CPU step counter must stay on the CPU.
                    if torch.is_tensor(value) and _same_device(value.device, self.device):
                        state[key] = value.to(self.offload_device, copy=copy)
                        self._moved_state.append((state, key))
        if self.config.weights:
            for module in self.modules:
                move_module(module, self.offload_device, copy=copy)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the freed blocks back, so a collocated engine can use them

    def onload(self, *, copy: bool = False) -> None:
        if not self.offloaded:
            return
        self.offloaded = False
        if self.config.weights:
            for module in self.modules:
                move_module(module, self.device, copy=copy)
        for state, key in self._moved_state:
            state[key] = state[key].to(self.device, copy=copy)
        self._moved_state = []
        for param, grad in self._parked_grads.items():
            param.grad = grad.to(param.device, copy=copy and self.config.grads)
        self._parked_grads = {}

    def _parameters(self) -> list[torch.nn.Parameter]:
        seen: dict[int, torch.nn.Parameter] = {}
        for module in self.modules:
            for param in module.parameters():
                seen.setdefault(id(param), param)
        return list(seen.values())


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` name the same device for a rank that sees one GPU."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)

"""Megatron-core's data parallelism and distributed optimizer, as the Megatron actor uses them.

- Parameters are the compute dtype (bf16 under ``actor.model.precision: bf16``): the forward, the recompute
  of a checkpointed layer and the backward all run in bf16 with no autocast to fall out of.
- megatron-core's ``DistributedDataParallel`` keeps them in one contiguous buffer and accumulates gradients
  into an fp32 buffer (``grad_reduce_in_fp32``); the gradients of the last micro-batch are reduce-scattered
  over the data-parallel group bucket by bucket while its backward still runs (``overlap_grad_reduce``).
- The distributed optimizer keeps fp32 main parameters and Adam moments for this rank's 1/DP slice of the
  buffer only, steps them, and all-gathers the updated parameters in the compute dtype.

Weight decay follows megatron-core: biases and norm weights are not decayed (torch's AdamW in the ``ddp``
and ``fsdp`` backends decays every parameter). Adam itself is Transformer Engine's or Apex's fused kernel
where installed, torch's AdamW otherwise (megatron-core chooses); torch's is switched to its fused kernel
(``fuse_torch_adam``), as the other backends use it: megatron-core builds it with the default, the per-tensor
``foreach`` path, which makes full-size fp32 temporaries and a kernel per step of the update.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from megatron.core.optimizer import (
    MegatronOptimizer,
    OptimizerConfig,
    get_megatron_optimizer,
)
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

from rlinf_search.workers.actor.config import OptimConfig
from rlinf_search.workers.actor.policy_trainer import set_adam_kernel


class MegatronDataParallel:
    """The trainer's ``parallel`` under Megatron: megatron-core's DDP already wraps the ``GPTModel``, so the
    scorer is not wrapped again, and nothing is autocast (the parameters are the compute dtype)."""

    gathers_collectively = False
    """Reading the full weights is the trainer's own tensor-parallel gather, done after each update."""

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def autocast(self, device: torch.device):
        return contextlib.nullcontext()


def wrap_data_parallel(gpt: torch.nn.Module) -> DistributedDataParallel:
    """``gpt`` (on its device, weights loaded: its parameters move into the buffer here) in megatron-core's DDP."""
    config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                           use_distributed_optimizer=True)
    return DistributedDataParallel(config=gpt.config, ddp_config=config, module=gpt)


def build_distributed_optimizer(model: DistributedDataParallel, optim: OptimConfig,
                                dtype: torch.dtype) -> MegatronOptimizer:
    """Adam with fp32 main parameters and moments sharded over the data-parallel ranks."""
    config = OptimizerConfig(optimizer="adam", lr=optim.lr, min_lr=optim.min_lr, weight_decay=optim.weight_decay,
                             adam_beta1=optim.adam_beta1, adam_beta2=optim.adam_beta2, adam_eps=optim.adam_eps,
                             clip_grad=optim.clip_grad, bf16=dtype == torch.bfloat16, params_dtype=dtype,
                             use_distributed_optimizer=True)
    optimizer = get_megatron_optimizer(config, [model])
    fuse_torch_adam(optimizer)
    return optimizer


def fuse_torch_adam(optimizer: MegatronOptimizer, fused: bool = True) -> None:
    """Run the torch Adam(W) inside megatron-core's optimizer with its fused kernel (or, ``fused=False``, the
    ``foreach`` one megatron-core leaves it with; the benchmark compares the two), before its first step."""
    for inner in _chained(optimizer):
        adam = getattr(inner, "optimizer", None)
        if isinstance(adam, (torch.optim.Adam, torch.optim.AdamW)):  # else TE's or Apex's FusedAdam: fused already
            set_adam_kernel(adam, fused)


def step_if_finite(optimizer: MegatronOptimizer) -> float:
    """Clip and step unless the gradient norm is not finite; the norm before clipping.

    megatron-core's ``step`` has no such check when there is no loss scaler (bf16), so its parts run here with
    the check between them: a non-finite norm is the same on every rank (it is reduced over all of them), so
    all skip.
    """
    optimizer.prepare_grads()
    norm = float(optimizer.get_grad_norm())
    if not math.isfinite(norm):
        return norm
    for inner in _chained(optimizer):
        parameters = inner.get_parameters()
        if parameters and inner.config.clip_grad > 0:
            clip_grad_by_total_norm_fp32(parameters, max_norm=inner.config.clip_grad, total_norm=norm)
    optimizer.step_with_ready_grads()
    return norm


def optimizer_state_bytes(optimizer: MegatronOptimizer) -> int:
    """Bytes this rank holds of fp32 main parameters and Adam state (its slice under the distributed optimizer)."""
    return sum(t.numel() * t.element_size() for t in optimizer_tensors(optimizer) if t.dim() > 0)  # no step counts


def optimizer_tensors(optimizer: MegatronOptimizer) -> list[torch.Tensor]:
    """This rank's fp32 main weights and Adam state: what ``actor.offload_optimizer`` moves."""
    out = []
    for inner in _chained(optimizer):
        for group in inner.optimizer.param_groups:
            out.extend(group["params"])
        for state in inner.optimizer.state.values():
            out.extend(v for v in state.values() if torch.is_tensor(v))
    return out


class LambdaSchedule:
    """``LambdaLR`` for an optimizer that is not a ``torch.optim.Optimizer`` (megatron-core's): every param
    group's lr is ``lr x factor(steps taken)``; ``state_dict`` reads like ``LambdaLR``'s ``last_epoch``."""

    def __init__(self, optimizer: MegatronOptimizer, factor: Callable[[int], float], lr: float):
        self.optimizer, self.factor, self.lr = optimizer, factor, lr
        self.last_epoch = 0
        self._apply()

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * self.factor(self.last_epoch)

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [self.lr * self.factor(self.last_epoch)]

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = int(state["last_epoch"])
        self._apply()


def _chained(optimizer: MegatronOptimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def save_optimizer_shard(optimizer: MegatronOptimizer, path) -> None:
    """This rank's fp32 main weights and Adam state (its slice) to ``path``: no collective, exact on resume.

    megatron-core's own ``save_parameter_state`` gathers every slice to one rank, and its loader expects
    Megatron-LM's checkpoint flow; a file per rank is all a resume with the same layout needs.
    """
    parts = [{"state": inner.optimizer.state_dict(),
              "main": [p.detach().cpu() for group in inner.optimizer.param_groups for p in group["params"]]}
             for inner in _chained(optimizer)]
    torch.save(parts, path)


def load_optimizer_shard(optimizer: MegatronOptimizer, path) -> None:
    """Restore what ``save_optimizer_shard`` wrote, on a rank with the same place in the same layout."""
    parts = torch.load(path, map_location="cpu", weights_only=False)
    chained = _chained(optimizer)
    for inner, part in zip(chained, parts, strict=True):
        params = [p for group in inner.optimizer.param_groups for p in group["params"]]
        shapes = [tuple(p.shape) for p in params]
        if shapes != [tuple(t.shape) for t in part["main"]]:
            raise ValueError(f"{path}: optimizer slices of another layout (data or tensor parallel size); "
                             "resume with the actor layout that wrote the checkpoint")
        with torch.no_grad():
            for param, value in zip(params, part["main"], strict=True):
                param.copy_(value)
        inner.optimizer.load_state_dict(part["state"])

"""How a trainer's model is spread over its data-parallel ranks: replicated (DDP) or fully sharded (FSDP2).

Both keep fp32 parameters, gradients and Adam state (the master copy) and compute in
``actor.model.precision``: a bf16 update at RL learning rates (1e-6) is below bf16's rounding step, so
bf16 parameters under a plain AdamW would not move. ``Replicated`` runs the forward under bf16 autocast;
``FullySharded`` lets FSDP2's ``MixedPrecisionPolicy`` cast each layer's gathered parameters to bf16
and reduce gradients in fp32.

- ``Replicated`` (``training_backend: ddp``; one process needs nothing else): every rank holds the whole
  model, its gradients and its optimizer state; DDP all-reduces gradients.
- ``FullySharded`` (``training_backend: fsdp``): ``fully_shard`` on every decoder layer and the root;
  each rank holds 1/N of the parameters, gradients and optimizer state; a layer's parameters are
  all-gathered for its forward and backward, and its gradients reduce-scattered. Optional CPU offload
  of the shards (``actor.fsdp_config.cpu_offload``). Runs on CPU with gloo, so it is tested for real.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist

from rlinf_search.checkpoint import TrainingState

COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a HF model (the ``layers`` ModuleList of its decoder): FSDP's unit."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h", "blocks"):
            return list(module)
    raise ValueError(f"{type(model).__name__}: no decoder layer list found to shard")


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Replicated:
    """The whole model on every rank; DDP across ranks when there are several."""

    gathers_collectively = False
    """Whether reading the full weights is a collective every rank must join."""

    def __init__(self, *, compute_dtype: str, group=None):
        self.compute_dtype = COMPUTE_DTYPES[compute_dtype]
        self.group = group
        self.rank, self.world_size = (dist.get_rank(group), dist.get_world_size(group)) if world()[1] > 1 \
            else (0, 1)

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.world_size == 1:
            return module
        # DDP averages gradients over ranks; the trainers' losses already divide by every rank's tokens.
        return torch.nn.parallel.DistributedDataParallel(module, process_group=self.group)

    def autocast(self, device: torch.device):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute_dtype)

    def clip_gradients(self, parameters, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)

    def full_state_dict(self, module: torch.nn.Module, dtype: torch.dtype | None = None,
                        on_device: bool = False) -> dict[str, torch.Tensor] | None:
        """``module``'s weights on CPU (copies on the device with ``on_device``), on rank 0 (None elsewhere: ranks
        hold the same weights); floating-point ones cast to ``dtype`` on the device first when given."""
        if self.rank != 0:
            return None
        where = None if on_device else "cpu"
        return {name: _cast(tensor.detach(), dtype).to(where, copy=True)
                for name, tensor in module.state_dict().items()}

    def optimizer_state(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> dict:
        """The ``TrainingState`` fields that keep the optimizer: the whole state (written by rank 0)."""
        return {"optimizer": optimizer.state_dict()}

    def load_optimizer_state(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainingState,
                             folder: Path) -> None:
        if state.optimizer is None:
            raise ValueError(f"{folder}: the checkpoint holds sharded optimizer state (written by the fsdp backend); "
                             "resume with the backend that wrote it")
        optimizer.load_state_dict(state.optimizer)


class FullySharded(Replicated):
    """FSDP2 over every rank of the default process group."""

    gathers_collectively = True
    OPTIMIZER_DIR = "optimizer_shards"
    """Folder of a checkpoint holding each rank's optimizer shard (``torch.distributed.checkpoint``)."""

    def __init__(self, *, compute_dtype: str, cpu_offload: bool = False):
        super().__init__(compute_dtype=compute_dtype)
        self.cpu_offload = cpu_offload

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            fully_shard,
        )

        if not dist.is_initialized():
            raise RuntimeError("FSDP needs torch.distributed initialised (the worker group does it)")
        mixed = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        options = {"mp_policy": mixed}
        if self.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        for layer in decoder_layers(module):
            fully_shard(layer, **options)
        fully_shard(module, **options)
        return module

    def autocast(self, device: torch.device):
        return contextlib.nullcontext()  # the mixed-precision policy casts per layer

    def clip_gradients(self, parameters, max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def full_state_dict(self, module: torch.nn.Module, dtype: torch.dtype | None = None,
                        on_device: bool = False) -> dict[str, torch.Tensor] | None:
        """Gathered on every rank (a collective), kept on rank 0's CPU only (on its device with ``on_device`` and a
        ``dtype``). With ``dtype``, one tensor at a time is gathered and cast on the device before it leaves: rank
        0's host holds the model in ``dtype`` only, never the fp32 whole."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        if dtype is None:
            state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return state if self.rank == 0 else None
        out, done = {}, {}
        for name, tensor in module.state_dict(keep_vars=True).items():  # every rank in the same order
            if id(tensor) in done:  # a tied weight (the LM head is the embedding): gathered once, listed twice
                out[name] = done[id(tensor)]
                continue
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            kept = _cast(full.detach(), dtype).to(None if on_device else "cpu", copy=True) if self.rank == 0 else None
            done[id(tensor)] = out[name] = kept
            del full
        return out if self.rank == 0 else None

    def optimizer_state(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> dict:
        """Each rank writes its shard to ``folder/optimizer_shards`` (a collective); the ``TrainingState``
        field names the folder."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        dcp.save({"optimizer": get_optimizer_state_dict(root, optimizer)},
                 checkpoint_id=str(Path(folder) / self.OPTIMIZER_DIR))
        return {"optimizer_shards": self.OPTIMIZER_DIR}

    def load_optimizer_state(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainingState,
                             folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        if state.optimizer_shards is None:
            raise ValueError(f"{folder}: the checkpoint holds no sharded optimizer state (written by another "
                             "training backend); resume with the backend that wrote it")
        target = {"optimizer": get_optimizer_state_dict(root, optimizer)}
        dcp.load(target, checkpoint_id=str(Path(folder) / state.optimizer_shards))
        set_optimizer_state_dict(root, optimizer, target["optimizer"])


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Floating-point tensors to ``dtype`` (integer buffers stay as they are)."""
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def init_single_process_group() -> None:
    """A one-rank process group, for FSDP in a process no worker group started (a benchmark, a test)."""
    import tempfile

    if dist.is_initialized():
        return
    store = dist.FileStore(tempfile.NamedTemporaryFile(delete=False).name, 1)
    # gloo beside nccl on a GPU: FSDP2 with its shards in CPU memory (``cpu_offload``) reduces on CPU tensors.
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=0, world_size=1)

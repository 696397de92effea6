"""What each spawned rank of the FSDP / DDP tests runs (a module of its own: spawned processes import it)."""

from __future__ import annotations

import os
import pickle
import warnings
from dataclasses import replace
from pathlib import Path

import torch


def _init(rank: int, world_size: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _gathered_old_logprobs(trainer, batch):
    """Every rank scores its share; the shares are put together as the driver does."""
    import torch.distributed as dist

    from rlinf_search.workers.actor.logprobs import place_rows

    share = trainer.compute_logprobs(batch)
    shares = [None] * dist.get_world_size()
    dist.all_gather_object(shares, share)
    return place_rows(tuple(batch.response_mask.shape), shares), share[0]


def train_steps(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Old log-probs, one PPO update, the gathered weights; then a checkpoint round trip under the backend."""
    import torch
    import torch.distributed as dist

    from rlinf_search.workers.actor.backends import build_trainer

    _init(rank, world_size, port)
    out = Path(out_dir)
    config = pickle.loads((out / "config.pkl").read_bytes())
    batch = pickle.loads((out / "batch.pkl").read_bytes())
    trainer = build_trainer(config)
    batch.old_logprobs, rows = _gathered_old_logprobs(trainer, batch)
    metrics = trainer.train_on_batch(batch)
    weights = trainer.rollout_state_dict()
    sync_weights = trainer.rollout_state_dict(torch.bfloat16)  # a weight sync to bf16 receivers
    local_params = {name: (str(p.dtype), tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape))
                    for name, p in trainer.scorer.named_parameters()}
    optim_dtypes = {str(v.dtype) for state in trainer.optimizer.state.values() for k, v in state.items()
                    if k != "step" and torch.is_tensor(v)}
    # Checkpoint: sharded optimizer, full weights; a new trainer resumes and the next update matches.
    ckpt = out / "ckpt"
    if rank == 0:
        ckpt.mkdir(exist_ok=True)
    dist.barrier()
    state = trainer.training_state(ckpt)
    if rank == 0:
        trainer.export_hf(ckpt / "hf_model", weights)
        torch.save(state, ckpt / "training_state.pt")
    dist.barrier()
    resumed = build_trainer(replace(config, model_path=str(ckpt / "hf_model")))
    resumed.load_training_state(torch.load(ckpt / "training_state.pt", weights_only=False), ckpt)
    after_first = trainer.train_on_batch(batch)
    after_resume = resumed.train_on_batch(batch)
    next_weights, resumed_weights = trainer.rollout_state_dict(), resumed.rollout_state_dict()
    result = {"rows": rows, "metrics": metrics, "weights": weights, "sync_weights": sync_weights,
              "local_params": local_params,
              "optim_dtypes": optim_dtypes, "next": (after_first, next_weights), "resumed": (after_resume, resumed_weights)}
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    # The results are on disk. Seen once (1 run in 3): a rank aborting in interpreter teardown ("terminate
    # called without an active exception", a native thread destroyed while joinable), after its work.
    os._exit(0)


def offload_round_trip(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Two trainers on the same batch, one of them offloaded and brought back (forced, as on a GPU) between its
    first and second updates; the metrics of three updates, the final weights of each, and the bytes the
    offloaded trainer's parameters, gradients and optimizer state still held while away."""
    import torch.distributed as dist

    from rlinf_search.workers.actor.backends import build_trainer
    from rlinf_search.workers.offload import CATEGORIES, OffloadConfig, Offloader, local_shard

    _init(rank, world_size, port)
    out = Path(out_dir)
    config = pickle.loads((out / "config.pkl").read_bytes())
    batch = pickle.loads((out / "batch.pkl").read_bytes())
    result = {}
    for name, offload in (("plain", False), ("offloaded", True)):
        trainer = build_trainer(config)
        with torch.no_grad():  # owned by the allocator, as on a GPU (the CPU loader memory-maps the checkpoint)
            for param in trainer.model.parameters():
                if not param.untyped_storage().resizable():
                    param.data = param.data.clone()
        batch.old_logprobs, _ = _gathered_old_logprobs(trainer, batch)
        offloader = Offloader(OffloadConfig(weights=True, grads=True, optimizer=True), trainer.offload_tensors,
                              device=trainer.device)
        metrics = [trainer.train_on_batch(batch)]
        if offload:
            listed = trainer.offload_tensors()
            offloader.offload(force=True)
            result["left_bytes"] = {category: sum(local_shard(t).untyped_storage().nbytes()
                                                  for t in getattr(listed, category)) for category in CATEGORIES}
            result["counted"] = {category: len(getattr(listed, category)) for category in CATEGORIES}
            offloader.onload()
        metrics += [trainer.train_on_batch(batch), trainer.train_on_batch(batch)]
        result[name] = (metrics, trainer.rollout_state_dict())
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)

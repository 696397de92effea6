"""What each spawned rank of the Megatron tests runs (a module of its own: spawned processes import it).

megatron-core assumes CUDA: the rotary embedding moves its frequencies to ``torch.cuda.current_device()``,
attention forks the CUDA RNG tracker around dropout (0 here, so there is nothing to fork), a recomputed layer
saves and restores the CUDA generator's state, DDP allocates its
buffers on ``torch.cuda.current_device()``, and the mixed-precision optimizers make scalars on ``"cuda"`` and
check that parameters are ``torch.cuda.*Tensor``. ``cpu_as_cuda`` maps all of these to the CPU, in these test
processes only, so megatron-core's real layers, DDP and distributed optimizer run over gloo and can be
compared with the HF and FSDP paths. It changes where tensors live, never what is computed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import warnings
from pathlib import Path


def cpu_as_cuda() -> None:
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as megatron_random

    class _NoRngFork:  # dropout is 0 here: no generator to fork, no state to save for a recompute
        def fork(self, name=None):
            return contextlib.nullcontext()

        def get_states(self):
            return {}

        def set_states(self, states):
            pass

        def is_initialized(self):
            return True

    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker = lambda *args, **kwargs: _NoRngFork()
    megatron_random.get_cuda_rng_tracker = tensor_parallel.get_cuda_rng_tracker
    # A recomputed layer saves and restores the "CUDA" generator's state: the CPU's stands in.
    megatron_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda *args, **kwargs: None

    def on_cpu(factory):
        @functools.wraps(factory)
        def made(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return factory(*args, **kwargs)
        return made

    for name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    tensor_type = torch.Tensor.type

    def cuda_type_name(self, *args, **kwargs):
        if args or kwargs or self.device.type != "cpu":
            return tensor_type(self, *args, **kwargs)
        return tensor_type(self).replace("torch.", "torch.cuda.", 1)

    torch.Tensor.type = cuda_type_name
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


def _init(rank: int, world_size: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")  # megatron-core warns that Apex/Transformer Engine are absent
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def build_and_score(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """Build this rank's GPTModel shard, load the HF weights, gather them back, score a batch."""
    import torch
    from transformers import AutoModelForCausalLM

    _init(rank, world_size, port)
    from megatron.core.models.gpt import GPTModel

    from rlinf_search.workers.actor.megatron.config import MegatronConfig
    from rlinf_search.workers.actor.megatron.hf_io import read_hf_state
    from rlinf_search.workers.actor.megatron.model import (
        MegatronCausalLM,
        build_gpt_model,
        gather_hf_weights,
        init_model_parallel,
        load_hf_weights,
        read_layout,
    )

    config = MegatronConfig(tensor_model_parallel_size=world_size)
    layout = read_layout(model_dir)
    init_model_parallel(config, seed=0)
    gpt = build_gpt_model(layout, config)
    load_hf_weights(gpt, read_hf_state(model_dir), layout, tensor_parallel_size=world_size, tensor_parallel_rank=rank)
    gathered = gather_hf_weights(gpt, layout)
    torch.manual_seed(0)
    ids = torch.randint(0, layout.vocab_size, (2, 12))
    attention = torch.ones_like(ids)
    attention[1, :4] = 0  # a left-padded row
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()(input_ids=ids, attention_mask=attention,
                                                                     position_ids=positions)
        cpu_as_cuda()  # after the HF model loads: transformers' loading does not expect wrapped factories
        ours = MegatronCausalLM(gpt, layout).eval()(input_ids=ids, attention_mask=attention, position_ids=positions)
    result = {"is_gpt": isinstance(gpt, GPTModel), "shapes": {k: tuple(v.shape) for k, v in gpt.state_dict().items()
                                                              if hasattr(v, "shape")},
              "gathered": gathered, "logits": ours.logits, "hf_logits": hf.logits, "mask": attention.bool()}
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def train_one_step(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """One PPO update by the Megatron trainer; every rank gets the whole batch, as the runner sends it."""
    import torch

    _init(rank, world_size, port)
    cpu_as_cuda()
    from rlinf_search.workers.actor.megatron.trainer import MegatronPolicyTrainer

    config = pickle.loads(Path(out_dir, "config.pkl").read_bytes())
    batch = pickle.loads(Path(out_dir, "batch.pkl").read_bytes())
    from rlinf_search.workers.actor.logprobs import place_rows

    trainer = MegatronPolicyTrainer(config)
    rows, old = trainer.compute_logprobs(batch)
    scored = [None] * world_size  # as the runner does: every rank's rows, then the whole batch to every rank
    torch.distributed.all_gather_object(scored, (rows, old))
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), scored)
    metrics = trainer.train_on_batch(batch)
    from rlinf_search.data.rank_plan import plan_passes

    passes = len(plan_passes(batch, list(range(len(batch) // config.n_minibatches)), rank=trainer.rank,
                             world_size=trainer.world_size, max_tokens=config.max_tokens_per_mbs).passes)
    from megatron.core import parallel_state

    groups = {"tensor": parallel_state.get_tensor_model_parallel_group(),
              "data": parallel_state.get_data_parallel_group()}
    result = {"rows": rows, "old": old, "metrics": metrics, "passes": passes,
              "weights": trainer.rollout_state_dict() if rank == 0 else None,
              "core_attention": type(trainer.gpt.decoder.layers[0].self_attention.core_attention).__name__,
              "adam_fused": [group["fused"] for inner in getattr(trainer.optimizer, "chained_optimizers",
                                                                 [trainer.optimizer])
                             for group in inner.optimizer.param_groups],
              "timeouts_s": {name: group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                             for name, group in groups.items()}}
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    torch.distributed.barrier()


def offload_round_trip(trainer, reference, batch) -> dict:
    """``actor.offload_*`` forced on the CPU (as on a GPU, where the host is another device) between two
    updates: what is left on the device while away, and the reference's scores after the way back."""

    from rlinf_search.workers.actor.logprobs import score_rows
    from rlinf_search.workers.offload import OffloadConfig, Offloader, module_tensors

    def tensors():
        out = trainer.offload_tensors()
        out.weights += module_tensors([reference], None).weights
        return out

    offloader = Offloader(OffloadConfig(weights=True, grads=True, optimizer=True), tensors, device=trainer.device)
    offloader.offload(force=True)
    listed = tensors()
    buffers = [t for b in trainer.ddp.buffers for t in (b.param_data, b.grad_data)]
    left = {name: sum(t.untyped_storage().nbytes() for t in getattr(listed, name) + (buffers if name == "weights"
                                                                                        else []))
            for name in ("weights", "grads", "optimizer")}
    counted = {name: len(getattr(listed, name)) for name in left}
    host = sum(h.numel() for pairs in offloader._away.values() for _, h in pairs)
    offloader.onload()
    _, ref = score_rows(reference, batch, rank=trainer.rank, world_size=trainer.world_size, packed=False,
                        temperature=1.0, max_tokens=trainer.config.max_tokens_per_mbs, rows_per_pass=None,
                        device=trainer.device)
    return {"left_bytes": left, "counted": counted, "host_bytes": host, "ref_after": ref}


def bf16_update_and_resume(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """Data parallel 2 under bf16 with full recompute: the dtype of every matmul of an update, where the fp32
    state lives and how it splits, the reference's scores, and a checkpoint round trip."""
    import sys

    import torch

    _init(rank, world_size, port)
    cpu_as_cuda()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from matmul_dtypes import observed_update

    from rlinf_search.workers.actor.logprobs import place_rows, score_rows
    from rlinf_search.workers.actor.megatron.optimizer import optimizer_state_bytes
    from rlinf_search.workers.actor.megatron.trainer import MegatronPolicyTrainer

    config = pickle.loads(Path(out_dir, "config.pkl").read_bytes())
    batch = pickle.loads(Path(out_dir, "batch.pkl").read_bytes())
    trainer = MegatronPolicyTrainer(config)
    rows, old = trainer.compute_logprobs(batch)
    reference = trainer.build_reference(config.model_path)
    _, ref = score_rows(reference, batch, rank=trainer.rank, world_size=trainer.world_size, packed=False,
                        temperature=1.0, max_tokens=config.max_tokens_per_mbs, rows_per_pass=None,
                        device=trainer.device)
    scored = [None] * world_size
    torch.distributed.all_gather_object(scored, (rows, old))
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), scored)
    flops = observed_update(trainer, batch)
    result = {"old": old, "ref": ref, "flops": flops, "state_bytes": optimizer_state_bytes(trainer.optimizer),
              "param_dtypes": {str(p.dtype) for p in trainer.gpt.parameters()},
              "main_dtypes": {str(p.dtype) for inner in trainer.optimizer.chained_optimizers
                              for group in inner.optimizer.param_groups for p in group["params"]},
              "model_numel": sum(p.numel() for p in trainer.gpt.parameters())}
    # The checkpoint: weights in HF names (rank 0) and the optimizer (every rank joins the gather).
    folder = Path(out_dir, "ckpt")
    if rank == 0:
        folder.mkdir()
        trainer.export_hf(folder / "hf", trainer.rollout_state_dict())
    torch.distributed.barrier()
    state = trainer.training_state(folder)
    if rank == 0:
        state.save(folder / "training_state.pt")
    torch.distributed.barrier()
    result["offload"] = offload_round_trip(trainer, reference, batch)
    result["next"] = (trainer.train_on_batch(batch), trainer.rollout_state_dict() if rank == 0 else None)
    from dataclasses import replace

    from rlinf_search.checkpoint import TrainingState

    resumed = MegatronPolicyTrainer(replace(config, model_path=str(folder / "hf")))
    resumed.load_training_state(TrainingState.load(folder / "training_state.pt"), folder)
    result["resumed"] = (resumed.train_on_batch(batch), resumed.rollout_state_dict() if rank == 0 else None)
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    torch.distributed.barrier()

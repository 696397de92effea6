"""What each spawned rank of the Megatron tests runs (a module of its own: spawned processes import it).

megatron-core's forward pass assumes CUDA in two places; ``allow_cpu_forward`` patches both, in
these test processes only, so its real layers run on CPU and their logits can be compared with HF's:
the rotary embedding moves its frequencies to ``torch.cuda.current_device()``, and attention forks
the CUDA RNG tracker around dropout (0 here, so there is nothing to fork).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import warnings
from pathlib import Path


def allow_cpu_forward() -> None:
    import torch
    from megatron.core import tensor_parallel

    class _NoRngFork:
        def fork(self, name=None):
            return contextlib.nullcontext()

    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker = lambda *args, **kwargs: _NoRngFork()


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
    allow_cpu_forward()
    torch.manual_seed(0)
    ids = torch.randint(0, layout.vocab_size, (2, 12))
    attention = torch.ones_like(ids)
    attention[1, :4] = 0  # a left-padded row
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = MegatronCausalLM(gpt, layout).eval()(input_ids=ids, attention_mask=attention, position_ids=positions)
        hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()(input_ids=ids, attention_mask=attention,
                                                                     position_ids=positions)
    result = {"is_gpt": isinstance(gpt, GPTModel), "shapes": {k: tuple(v.shape) for k, v in gpt.state_dict().items()
                                                              if hasattr(v, "shape")},
              "gathered": gathered, "logits": ours.logits, "hf_logits": hf.logits, "mask": attention.bool()}
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def train_one_step(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """One PPO update by the Megatron trainer; every rank gets the whole batch, as the runner sends it."""
    import torch

    _init(rank, world_size, port)
    allow_cpu_forward()
    from rlinf_search.workers.actor.megatron.trainer import MegatronPolicyTrainer

    config = pickle.loads(Path(out_dir, "config.pkl").read_bytes())
    batch = pickle.loads(Path(out_dir, "batch.pkl").read_bytes())
    from rlinf_search.workers.actor.logprobs import place_rows

    trainer = MegatronPolicyTrainer(config)
    rows, old = trainer.compute_logprobs(batch)
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [(rows, old)])
    metrics = trainer.train_on_batch(batch)
    result = {"rows": rows, "old": old, "metrics": metrics,
              "weights": trainer.rollout_state_dict() if rank == 0 else None}
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    torch.distributed.barrier()

"""The Megatron actor: the FSDP backend's PPO update and policy loss on a tensor-parallel ``GPTModel``.

What differs from ``PolicyTrainer``, and nothing else:
- the model: a Qwen2 ``GPTModel`` built from the HF config, loaded with the HF weights, wrapped so it
  is called like a HF causal LM (full-vocabulary logits on every tensor-parallel rank);
- data parallelism runs over Megatron's data-parallel group: every rank gets the whole batch and the
  rows are dealt by data-parallel rank, so the ranks of a tensor-parallel group (one model computed
  together) take the same rows and passes;
- parameters are fp32 (the master weights) and bf16 compute is autocast, as in ``ddp``;
- the gradient norm counts tensor-parallel shards once;
- weights leave in HF names: after every update the data-parallel-rank-0 group gathers its shards,
  so ``rollout_state_dict`` and the HF checkpoint on rank 0 need no collective of their own (the
  runtime calls those on rank 0 only).

Needs CUDA: ``require_training_backend`` stops a run without GPUs before any worker starts.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

from rlinf_search.checkpoint import TrainingState
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.actor.megatron.hf_io import read_hf_config, read_hf_state, write_hf_model
from rlinf_search.workers.actor.megatron.model import (
    MegatronCausalLM,
    build_gpt_model,
    gather_hf_weights,
    init_model_parallel,
    load_hf_weights,
    read_layout,
)
from rlinf_search.workers.actor.megatron.weights import StateDict
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer

log = logging.getLogger(__name__)


class MegatronPolicyTrainer(PolicyTrainer):
    """``PolicyTrainer`` on Megatron-core: tensor parallel within a group, data parallel across groups."""

    def __init__(self, config: ActorConfig):
        if config.megatron is None:
            raise ValueError("MegatronPolicyTrainer needs actor.megatron settings (validate_cfg fills them)")
        self.megatron = config.megatron
        self.layout = read_layout(config.model_path)
        self._hf_state: StateDict | None = None
        super().__init__(config)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()

    # ---- PolicyTrainer hooks ------------------------------------------------------------------
    packs_sequences = False  # the GPTModel wrapper takes padded rows with an attention mask

    def _build_model(self) -> torch.nn.Module:
        # fp32 parameters (the master weights); bf16 compute comes from autocast (Replicated.autocast).
        dtype = torch.float32
        if not dist.is_initialized():  # one rank: megatron-core still wants a process group
            store = dist.FileStore(tempfile.NamedTemporaryFile(delete=False).name, 1)
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store, rank=0,
                                    world_size=1)
        init_model_parallel(self.megatron, seed=self.config.seed)
        gpt = build_gpt_model(self.layout, self.megatron, dtype=dtype)
        hf_state = {k: v.to(dtype) for k, v in read_hf_state(self.config.model_path).items()}
        load_hf_weights(gpt, hf_state, self.layout,
                        tensor_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
                        tensor_parallel_rank=parallel_state.get_tensor_model_parallel_rank())
        if dist.get_rank() == 0:  # the starting weights are the first ones the rollout gets
            self._hf_state = hf_state
        return MegatronCausalLM(gpt, self.layout).to(self.device)

    def _data_parallel_world(self) -> tuple[int, int, object]:
        return (parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size(),
                parallel_state.get_data_parallel_group())

    def _clip_gradients(self) -> torch.Tensor:
        # Shards are summed over the tensor-parallel group; replicated tensors (norms) count once.
        grads = [p.grad for p in self.model.parameters()
                 if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
        squares = torch.zeros(1, dtype=torch.float32, device=self.device)
        for grad in grads:
            squares += grad.float().pow(2).sum()
        if self.tp_size > 1:
            dist.all_reduce(squares, group=self.tp_group)
        norm = squares.sqrt()[0]
        scale = self.config.optim.clip_grad / (norm + 1e-6)
        if scale < 1:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return norm

    # ---- training: every rank has the whole batch; a tensor-parallel group shares one data-parallel rank's
    # rows (``data.rank_plan`` deals rows by data-parallel rank), so its ranks run the same passes --------
    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        metrics = super().train_on_batch(batch)
        self._refresh_hf_state()
        return metrics

    # ---- weights out ---------------------------------------------------------------------------
    def _refresh_hf_state(self) -> None:
        """Gather the updated shards in HF names on the data-parallel-rank-0 group (a collective there)."""
        if self.rank == 0:
            self._hf_state = gather_hf_weights(self.model.gpt, self.layout)
            if self.tp_rank != 0:
                self._hf_state = None  # only global rank 0 sends weights and writes checkpoints

    def gathered_hf_state(self) -> StateDict:
        """The weights after the last update in HF names, as a HF checkpoint file holds them."""
        if self._hf_state is None:
            raise RuntimeError("the gathered weights are served by global rank 0 of the Megatron actor only")
        return self._hf_state

    def rollout_state_dict(self) -> StateDict:
        if self._hf_state is None:
            return {}  # only global rank 0 holds (and sends) the gathered weights
        state = self.gathered_hf_state()
        if self.layout.tie_word_embeddings:  # model.state_dict() lists the tied head under its own name too
            state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
        return state

    def export_hf(self, path: str | Path, state: StateDict) -> None:
        source = self.config.model_path
        write_hf_model(self.gathered_hf_state(), read_hf_config(source), path, source_dir=source)

    def load_training_state(self, state: TrainingState, folder: Path) -> None:
        # The checkpoint's optimizer state is rank 0's shard (rank 0 writes it): with tensor parallelism
        # the other ranks' moments have other shapes, so they restart rather than load a stranger's.
        if self.tp_size > 1:
            log.warning("resuming a tensor-parallel Megatron actor: weights, schedule and step are restored; "
                        "Adam moments restart (the checkpoint holds rank 0's optimizer shard only)")
            self.scheduler.load_state_dict(state.scheduler)
            self.global_step = state.global_step
            self._rng.setstate(state.rng)
            return
        super().load_training_state(state, folder)

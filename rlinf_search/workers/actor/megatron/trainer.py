"""The Megatron actor: the FSDP backend's PPO update and policy loss on a tensor-parallel ``GPTModel``.

What differs from ``PolicyTrainer``, and nothing else:
- the model: a Qwen2 ``GPTModel`` built from the HF config, loaded with the HF weights, wrapped so it
  is called like a HF causal LM (full-vocabulary logits on every tensor-parallel rank);
- parameters are the compute dtype (bf16), so forward, recompute and backward run in bf16; megatron-core's
  DDP reduces fp32 gradients and its distributed optimizer keeps fp32 main weights and Adam state, each
  data-parallel rank its slice (``megatron/optimizer.py``);
- data parallelism runs over Megatron's data-parallel group: every rank gets the whole batch and the
  rows are dealt by data-parallel rank, so the ranks of a tensor-parallel group (one model computed
  together) take the same rows and passes;
- the reference model is a frozen ``GPTModel`` sharded like the policy;
- weights leave in HF names: after every update the data-parallel-rank-0 group gathers its shards,
  so ``rollout_state_dict`` and the HF checkpoint on rank 0 need no collective of their own (the
  runtime calls those on rank 0 only).

Needs CUDA: ``require_training_backend`` stops a run without GPUs before any worker starts. The tests run
it on CPU with gloo, megatron-core's CUDA device names mapped to the CPU (``tests/megatron_ranks.py``).
"""

from __future__ import annotations

import contextlib
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

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
from rlinf_search.workers.actor.megatron.optimizer import (
    LambdaSchedule,
    MegatronDataParallel,
    build_distributed_optimizer,
    load_optimizer_shard,
    optimizer_tensors,
    save_optimizer_shard,
    step_if_finite,
    wrap_data_parallel,
)
from rlinf_search.workers.actor.megatron.weights import StateDict
from rlinf_search.workers.actor.parallel import COMPUTE_DTYPES
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer, lr_lambda
from rlinf_search.workers.actor.token_scoring import TokenScorer
from rlinf_search.workers.offload import OffloadTensors, module_tensors


class MegatronPolicyTrainer(PolicyTrainer):
    """``PolicyTrainer`` on Megatron-core: tensor parallel within a group, data parallel across groups."""

    def __init__(self, config: ActorConfig):
        if config.megatron is None:
            raise ValueError("MegatronPolicyTrainer needs actor.megatron settings (validate_cfg fills them)")
        self.megatron = config.megatron
        self.layout = read_layout(config.model_path)
        self._hf_state: StateDict | None = None
        super().__init__(config)
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()

    # ---- PolicyTrainer hooks ------------------------------------------------------------------
    packs_sequences = False  # the GPTModel wrapper takes padded rows with an attention mask
    serves_weights_from_host = True  # gathered to rank 0's host after each update (``_refresh_hf_state``)

    def _build_model(self) -> torch.nn.Module:
        self.dtype = COMPUTE_DTYPES[self.config.dtype]
        if not dist.is_initialized():  # one rank: megatron-core still wants a process group
            store = dist.FileStore(tempfile.NamedTemporaryFile(delete=False).name, 1)
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store, rank=0,
                                    world_size=1, timeout=timedelta(seconds=self.megatron.process_group_timeout_s))
        init_model_parallel(self.megatron, seed=self.config.seed)
        gpt, hf_state = self._load_gpt(self.config.model_path)
        if dist.get_rank() == 0:  # the starting weights are the first ones the rollout gets
            self._hf_state = hf_state
        self.gpt = gpt
        self.ddp = wrap_data_parallel(gpt)
        return MegatronCausalLM(self.ddp, self.layout)

    def _load_gpt(self, model_path: str) -> tuple[torch.nn.Module, StateDict]:
        """This rank's ``GPTModel`` shard in the compute dtype with the HF weights at ``model_path``, on the
        device; and those weights (on CPU, HF names)."""
        # The local spec's norms are torch modules made in fp32 whatever params_dtype says: cast them too, as
        # Megatron-LM's Float16Module does, so every parameter (and the optimizer's view of them) is bf16.
        gpt = build_gpt_model(self.layout, self.megatron, dtype=self.dtype).to(self.dtype)
        hf_state = {k: v.to(self.dtype) for k, v in read_hf_state(model_path).items()}
        load_hf_weights(gpt, hf_state, self.layout,
                        tensor_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
                        tensor_parallel_rank=parallel_state.get_tensor_model_parallel_rank())
        return gpt.to(self.device), hf_state

    def _data_parallel_world(self) -> tuple[int, int, object]:
        return (parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size(),
                parallel_state.get_data_parallel_group())

    def _parallel(self, group) -> MegatronDataParallel:
        return MegatronDataParallel()

    def _build_optimizer(self):
        optimizer = build_distributed_optimizer(self.ddp, self.config.optim, self.dtype)
        return optimizer, LambdaSchedule(optimizer, lr_lambda(self.config.optim), self.config.optim.lr)

    def _zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _pass_context(self, *, last: bool):
        # Gradients accumulate locally until the last micro-batch, whose backward reduces them bucket by bucket.
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def _apply_gradients(self) -> float:
        self.ddp.finish_grad_sync()
        return step_if_finite(self.optimizer)

    def offload_tensors(self) -> OffloadTensors:
        """The parameters are views of megatron-core's DDP parameter buffer and ``main_grad`` views of its fp32
        gradient buffer, so those buffers are what moves; the optimizer's part is its fp32 main-weight slice
        and Adam state."""
        tensors = module_tensors([self.gpt], None)
        tensors.grads = [p.main_grad for p in self.gpt.parameters() if getattr(p, "main_grad", None) is not None]
        tensors.optimizer = optimizer_tensors(self.optimizer)
        return tensors

    def build_reference(self, model_path: str) -> torch.nn.Module:
        """The frozen starting policy: a ``GPTModel`` sharded like the policy, in the compute dtype."""
        gpt, _ = self._load_gpt(model_path)
        scorer = TokenScorer(MegatronCausalLM(gpt, self.layout).eval(), chunk_tokens=self.config.logprob_chunk_tokens)
        return scorer.requires_grad_(False)

    # ---- training: every rank has the whole batch; a tensor-parallel group shares one data-parallel rank's
    # rows (``data.rank_plan`` deals rows by data-parallel rank), so its ranks run the same passes --------
    def train_on_batch(self, batch: RolloutBatch) -> dict[str, float]:
        metrics = super().train_on_batch(batch)
        self._refresh_hf_state()
        return metrics

    def train_on_minibatch(self, batch: RolloutBatch) -> dict[str, float]:
        metrics = super().train_on_minibatch(batch)
        self._refresh_hf_state()
        return metrics

    # ---- weights out ---------------------------------------------------------------------------
    def _refresh_hf_state(self) -> None:
        """Gather the updated shards in HF names on the data-parallel-rank-0 group (a collective there)."""
        if self.rank == 0:
            self._hf_state = gather_hf_weights(self.gpt, self.layout)
            if self.tp_rank != 0:
                self._hf_state = None  # only global rank 0 sends weights and writes checkpoints

    def gathered_hf_state(self) -> StateDict:
        """The weights after the last update in HF names, as a HF checkpoint file holds them."""
        if self._hf_state is None:
            raise RuntimeError("the gathered weights are served by global rank 0 of the Megatron actor only")
        return self._hf_state

    def rollout_state_dict(self, dtype: torch.dtype | None = None, on_device: bool = False) -> StateDict:
        """The weights gathered at the last update, in the compute dtype whatever ``dtype`` asks: they are bf16
        already, and a receiver of another 16-bit dtype casts them as it loads (a cast here would be the same
        rounding, done on rank 0's CPU). They live on the host whatever ``on_device`` asks: the gather after each
        update put them there."""
        if self._hf_state is None:
            return {}  # only global rank 0 holds (and sends) the gathered weights
        state = self.gathered_hf_state()
        if self.layout.tie_word_embeddings:  # model.state_dict() lists the tied head under its own name too
            state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
        return state

    def export_hf(self, path: str | Path, state: StateDict) -> None:
        source = self.config.model_path
        write_hf_model(self.gathered_hf_state(), read_hf_config(source), path, source_dir=source)

    def training_state(self, folder: Path) -> TrainingState:
        """Every rank writes its optimizer slice to ``folder/megatron_optimizer/rank{rank}.pt``; rank 0 saves
        the returned state."""
        shards = Path(folder) / OPTIMIZER_DIR
        shards.mkdir(parents=True, exist_ok=True)
        save_optimizer_shard(self.optimizer, shards / f"rank{dist.get_rank()}.pt")
        return TrainingState(scheduler=self.scheduler.state_dict(), global_step=self.global_step,
                             rng=self._rng.getstate(), optimizer_shards=OPTIMIZER_DIR)

    def load_training_state(self, state: TrainingState, folder: Path) -> None:
        shards = Path(folder) / OPTIMIZER_DIR
        if state.optimizer_shards != OPTIMIZER_DIR:
            raise ValueError(f"{folder}: the checkpoint holds no Megatron optimizer state (written by another "
                             "training backend); resume with the backend that wrote it")
        written = len(list(shards.glob("rank*.pt")))
        if written != dist.get_world_size():
            raise ValueError(f"{shards}: optimizer slices of {written} ranks, and this actor has "
                             f"{dist.get_world_size()}; resume with the actor layout that wrote the checkpoint")
        # The weights came from the checkpoint's HF folder: bf16 copies of the main weights restored here.
        load_optimizer_shard(self.optimizer, shards / f"rank{dist.get_rank()}.pt")
        self.scheduler.load_state_dict(state.scheduler)
        self.global_step = state.global_step
        self._rng.setstate(state.rng)


OPTIMIZER_DIR = "megatron_optimizer"
"""Folder of a checkpoint with the distributed optimizer's state, one file per rank."""

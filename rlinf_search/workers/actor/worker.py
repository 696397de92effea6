"""A rank of the ActorGroup: the policy trainer, the frozen reference model, checkpoints.

Every rank receives the whole batch and works on its token-balanced share (``data.rank_plan``). With
``fsdp`` the policy and the reference are sharded, so gathering the weights (weight sync, checkpoints)
is a collective every rank joins; rank 0 then holds the full weights and writes them.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import torch

from rlinf_search.checkpoint import (
    HF_SUBDIR,
    RunnerState,
    begin_checkpoint,
    load_checkpoint,
    save_checkpoint,
    staging_folder,
)
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.scheduler import Worker
from rlinf_search.workers.actor.backends import build_trainer
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.actor.logprobs import ForwardLogprobs, score_rows
from rlinf_search.workers.actor.memory_plan import plan_exceeds_device
from rlinf_search.workers.offload import (
    CATEGORIES,
    Offloader,
    OffloadTensors,
    module_tensors,
)


class ActorWorker(Worker):
    """Data-parallel policy training on a share of every batch."""

    def __init__(self, config: ActorConfig, resume_from: str | None = None):
        from transformers import AutoTokenizer

        if torch.cuda.is_available():  # before any weight loads: a plan that cannot fit stops here, in one line
            problem = plan_exceeds_device(config, ranks=self.world_size,
                                          device_bytes=torch.cuda.get_device_properties(0).total_memory)
            if problem:
                raise RuntimeError(problem)
        if self.world_size > 1:
            # Megatron's checkpoint gathers of a large model can outlast the default timeout: it sets its own.
            timeout = {"timeout_s": config.megatron.process_group_timeout_s} if config.megatron is not None else {}
            self.init_process_group(cpu_collectives=config.fsdp_cpu_offload, **timeout)
        start = config
        if resume_from:  # weights come from the checkpoint; optimizer state is loaded below
            start = replace(config, model_path=str(Path(resume_from) / HF_SUBDIR))
        self.config = config
        self.trainer = build_trainer(start)  # actor.training_backend: fsdp, ddp or megatron
        self.tokenizer = AutoTokenizer.from_pretrained(start.model_path)
        # The reference is the starting policy, even after a resume.
        self.reference = self.trainer.build_reference(config.model_path) if config.loss.kl_beta > 0 else None
        if resume_from:
            _, training_state = load_checkpoint(Path(resume_from))
            self.trainer.load_training_state(training_state, Path(resume_from))
        # Between an update and the actor's next phase the engine may need the device (collocated); the first
        # rollout comes before any update.
        self.offloader = Offloader(config.offload, self._offload_tensors, device=self.trainer.device)
        self.offloader.offload()

    def _offload_tensors(self) -> OffloadTensors:
        tensors = self.trainer.offload_tensors()
        if self.reference is not None:
            tensors.weights += module_tensors([self.reference], None).weights
        return tensors

    def compute_logprobs(self, batch: RolloutBatch, *, old: bool, ref: bool) -> ForwardLogprobs:
        """This rank's share of ``batch`` (the whole batch), when no InferenceGroup sits apart from the
        actor: ``old``, log-probs under the current weights (before this step's update); ``ref``, under
        the reference (loaded when ``actor.loss.kl_beta`` > 0)."""
        if ref and self.reference is None:
            raise RuntimeError("reference log-probs asked of an actor without a reference model "
                               "(actor.loss.kl_beta is 0)")
        self.offloader.onload()
        rows, old_logprobs = self.trainer.compute_logprobs(batch) if old else (None, None)
        ref_logprobs = None
        if ref:
            cfg = self.config
            rows, ref_logprobs = score_rows(self.reference, batch, rank=self.trainer.rank,
                                            world_size=self.trainer.world_size, packed=self.trainer.packed,
                                            temperature=cfg.loss.temperature, max_tokens=cfg.max_tokens_per_mbs,
                                            rows_per_pass=cfg.forward_micro_batch_size, device=self.trainer.device,
                                            share_prompts=self.trainer.shares_prompts)
        return ForwardLogprobs(rows=rows or [], old=old_logprobs, ref=ref_logprobs)

    def train(self, batch: RolloutBatch) -> dict[str, float]:
        self.offloader.onload()
        metrics = self.trainer.train_on_batch(batch)
        self.offloader.offload()  # a weight sync or checkpoint brings back what it reads
        return metrics

    def train_minibatch(self, batch: RolloutBatch) -> dict[str, float]:
        """One optimizer step on ``batch`` (a streamed step's mini-batch); the engine stays where it is."""
        self.offloader.onload()
        metrics = self.trainer.train_on_minibatch(batch)
        self.offloader.offload()
        return metrics

    def weights_need_every_rank(self) -> bool:
        return self.trainer.gathers_weights_collectively

    def get_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The weights for a sync, in the dtype every receiver loads (``actor.sync_dtype``; fp32 when None); left
        on the device with ``on_device`` (copies: the offloader may move the parameters away after this)."""
        dtype = None if self.config.sync_dtype is None else getattr(torch, self.config.sync_dtype)
        on_host = self.trainer.serves_weights_from_host  # nothing on the device to bring back
        with contextlib.nullcontext() if on_host else self.offloader.on_device("weights"):
            return self.trainer.rollout_state_dict(dtype, on_device=on_device)

    def save(self, ckpt_dir: str, state: RunnerState, begun: bool = False) -> str | None:
        """Every rank gathers the weights (and, with ``fsdp``, writes its optimizer shard into the staged
        checkpoint); rank 0 writes the rest and seals it. ``begun``: the driver staged the checkpoint with
        ``begin_checkpoint`` and other groups' parts are already in it."""
        with self.offloader.on_device(*CATEGORIES):
            return self._save(ckpt_dir, state, begun)

    def _save(self, ckpt_dir: str, state: RunnerState, begun: bool) -> str | None:
        if not begun:
            if self.rank == 0:
                begin_checkpoint(Path(ckpt_dir), state.global_step)
            if self.world_size > 1:
                torch.distributed.barrier()  # the staging folder exists before any rank writes into it
        weights = self.trainer.rollout_state_dict()
        training_state = self.trainer.training_state(staging_folder(Path(ckpt_dir), state.global_step))
        if self.rank != 0:
            return None
        return str(save_checkpoint(Path(ckpt_dir), state, model=_Export(self.trainer, weights), tokenizer=self.tokenizer,
                                   training_state=training_state, begun=True))


class _Export:
    """``save_pretrained`` for a checkpoint: the gathered weights as a HF model directory."""

    def __init__(self, trainer, weights: dict[str, torch.Tensor]):
        self.trainer, self.weights = trainer, weights

    def save_pretrained(self, path: str | Path) -> None:
        self.trainer.export_hf(path, self.weights)

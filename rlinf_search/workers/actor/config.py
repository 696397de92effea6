"""Typed settings of the actor (policy training) backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from rlinf_search.section_model import ConfigSection
from rlinf_search.workers.actor.megatron.config import MegatronConfig
from rlinf_search.workers.actor.packed_attention import PACKED_ATTENTION
from rlinf_search.workers.offload import OffloadConfig


class OptimSection(ConfigSection):
    """``actor.optim`` (``critic.optim``): AdamW."""

    config_path = "actor.optim"

    lr: float = Field(1e-6, ge=0, le=1)
    """Peak learning rate (Search-R1: 1e-6)."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2."""
    adam_eps: float = Field(1e-8, gt=0, le=1)
    """AdamW epsilon."""
    weight_decay: float = Field(0.01, ge=0, le=1)
    """AdamW decoupled weight decay."""
    clip_grad: float = Field(1.0, gt=0)
    """Global gradient-norm clip."""


class LrSchedSection(ConfigSection):
    """``actor.lr_sched`` (``critic.lr_sched``): the learning-rate schedule."""

    config_path = "actor.lr_sched"

    lr_warmup_fraction: float = Field(0.0, ge=0, le=1)
    """Share of the run's optimizer steps spent warming up linearly from 0 (Search-R1: 0.285)."""
    lr_decay_style: Literal["constant", "cosine"] = "constant"
    """After warm-up: ``constant`` or ``cosine`` (down to ``min_lr``)."""
    min_lr: float = Field(0.0, ge=0, le=1)
    """Floor of the cosine decay."""


class OptimConfig(OptimSection, LrSchedSection):
    """``optim`` and ``lr_sched`` together, over the run's optimizer steps: what the trainer builds AdamW and its
    schedule from."""

    total_steps: int = Field(1, ge=1, json_schema_extra={"set_from": "the run's steps x ppo_epochs x n_minibatches"})
    """Optimizer steps of the whole run (warm-up and decay are fractions of it)."""


@dataclass(frozen=True)
class PolicyLossConfig:
    """The ``algorithm`` keys the policy update reads."""

    policy_loss: str = "ppo"
    """``algorithm.policy_loss``: the loss per model token (``POLICY_LOSSES``: a registered name or a dotted path)."""
    policy_loss_settings: Any = None
    """``algorithm.policy_loss_settings``: the loss's own keys, an instance of the settings model it declares
    (``plugin_settings.with_settings``), passed to it as ``settings=``; None for a loss that declares none."""
    clip_ratio_low: float = 0.2
    """PPO clip below 1 (``ratio_clip_eps`` sets both sides when the asymmetric keys are absent)."""
    clip_ratio_high: float = 0.2
    """PPO clip above 1 (DAPO/slime use 0.28)."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip constant for negative advantages; None turns it off."""
    loss_agg_func: str = "token-mean"
    """``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm``."""
    kl_beta: float = 0.0
    """Coefficient of the KL-to-reference loss term (Search-R1: 0.001); 0 skips the reference model."""
    kl_penalty_type: str = "low_var_kl"
    """KL estimator: ``k1``, ``k2``, ``low_var_kl`` (k3)."""
    entropy_bonus: float = 0.0
    """Entropy coefficient (Search-R1: 0.001, RLinf: 0)."""
    temperature: float = 1.0
    """Sampling temperature: log-probs are recomputed as log_softmax(logits / temperature)."""
    mismatch_correction: str | None = None
    """Train/inference mismatch and staleness correction: None, ``tis`` (truncate), ``mask`` (token-level MIS) or
    ``decoupled`` (AReaL's decoupled objective, the weight untruncated) or ``m2po`` (``decoupled`` with M2PO's
    second-moment token mask)."""
    max_token_lag: int | None = None
    """Model tokens sampled more than this many policy versions before the one the update starts from are
    dropped from the loss and counted (``actor/stale_fraction``); None keeps every token."""
    mismatch_cap: float = 2.0
    """TIS cap C, and the upper bound of the ``mask`` band."""
    mismatch_low: float = 0.5
    """Lower bound of the ``mask`` band."""
    norm_constant: float | None = None
    """The constant length of ``seq-mean-token-sum-norm`` (default: the response token budget)."""
    top_k_divergence: str = "forward"
    """``algorithm.distill.top_k_divergence``: the direction of the KL to the distillation teacher's top k
    (``forward`` = KL(teacher || student), ``reverse``); read only when the batch carries a top k."""


@dataclass(frozen=True)
class ActorConfig:
    """Everything the actor needs to build its model and run PPO updates (built by ``config/training.py`` from the
    ``actor`` and ``algorithm`` sections)."""

    model_path: str
    """Hugging Face causal LM directory."""
    optim: OptimConfig = OptimConfig()
    """Optimizer and schedule."""
    loss: PolicyLossConfig = PolicyLossConfig()
    """Policy-loss settings."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    n_minibatches: int = 1
    """Optimizer steps per epoch; the batch is cut into this many mini-batches."""
    max_tokens_per_mbs: int | None = None
    """Token budget of a micro-batch (gradient accumulation); None = one micro-batch per mini-batch."""
    dtype: str = "float32"
    """``actor.model.precision``: compute precision, ``float32`` or ``bfloat16``. Parameters, gradients and
    optimizer state are fp32 either way (bf16 compute over fp32 master weights)."""
    gradient_checkpointing: bool = False
    """``actor.model.enable_gradient_checkpointing``: recompute each layer's activations in backward."""
    pack_sequences: bool = True
    """``actor.model.use_remove_padding``: a micro-batch's rows go through the model as one packed sequence
    (position ids restart per row), so no padding token is computed."""
    share_prompts: bool = False
    """``actor.model.share_prompts``: the rows of a pass that share a prompt (a GRPO group) go through the model as
    one sequence, the prompt computed once (``shared_prompts.py``); passes and mini-batches keep a prompt's rows
    together. Padded rows and ``sdpa`` only (checked by ``validate_cfg``)."""
    pack_traj: bool = True
    """``actor.pack_traj``: a multi-turn trajectory trains as one sequence (its tool observations masked). False:
    each model turn is its own sequence, its context the trajectory before it (RLinf's turn-level training;
    ``data/turn_rows.py``), weighted so the loss is the same aggregation over trajectories; it costs a forward
    pass over each turn's context. Old and reference log-probs are still scored on the whole trajectory."""
    attn_implementation: str | None = None
    """``actor.model.attn_implementation``: the HF attention kernel of the actor's models (policy, reference,
    the InferenceGroup's copies): ``sdpa``, ``eager``, ``sdpa_varlen``, ``flash_attention_2``, ...
    (``hf_model.py``); None: ``sdpa_varlen`` when ``pack_sequences``, else transformers' default (sdpa)."""
    compile_layers: bool = False
    """``actor.model.compile_layers``: compile each decoder layer with ``torch.compile`` (``fsdp`` and ``ddp``;
    ``hf_model.compile_decoder_layers``): the layers' small ops fused around the matmuls, the attention kernel left
    eager. Costs a compile at the first update (and a recompile when shapes first change)."""
    logprob_chunk_tokens: int = 1024
    """``actor.model.logprob_chunk_size``: response tokens per LM-head chunk when computing log-probs."""
    fsdp_cpu_offload: bool = False
    """``actor.fsdp_config.cpu_offload``: FSDP2 keeps parameter and optimizer shards in CPU memory and
    moves each layer to the GPU for its compute (for GPUs too small for the shards)."""
    seed: int = 0
    """Seed for mini-batch shuffling."""
    shuffle_rollout: bool = True
    """``algorithm.shuffle_rollout``: shuffle the batch's rows before each epoch cuts it into mini-batches;
    false keeps rollout order (a prompt's group stays in one mini-batch where the sizes allow)."""
    training_backend: str = "fsdp"
    """``actor.training_backend``: ``fsdp`` (FSDP2: parameters, gradients and optimizer state sharded over
    the ranks), ``ddp`` (a whole copy per rank) or ``megatron`` (megatron-core, tensor parallel; GPUs only).
    See ``workers/actor/backends.py``."""
    megatron: MegatronConfig | None = None
    """The Megatron backend's parallel/recompute settings; None for ``fsdp``."""
    forward_micro_batch_size: int | None = None
    """``algorithm.logprob_forward_micro_batch_size``: rows per forward-only pass (old and reference
    log-probs); None packs rows by ``max_tokens_per_mbs`` instead."""
    sync_dtype: str | None = None
    """The dtype the weights leave in at each weight sync: the one every receiver (the rollout engine, and the
    InferenceGroup's policy copy) loads them into, ``float16`` or ``bfloat16``, so the cast happens once on the
    actor's device and the gather, the host copy and the transfer are half of fp32's. None (receivers of
    different or fp32 dtypes, or ``auto``): fp32, each receiver casts. Set by ``validate_cfg``; checkpoints
    keep fp32."""
    offload: OffloadConfig = OffloadConfig()
    """``actor.offload_weight`` / ``offload_grad`` / ``offload_optimizer``: what leaves the device
    after each update until the actor's next phase."""

    @property
    def model_attention(self) -> str | None:
        """The kernel the actor's models load with: ``attn_implementation``; when that is None and rows are to be
        packed, ``sdpa_varlen`` (``packed_attention.py``: packed rows without flash-attn), else transformers'
        default."""
        if self.attn_implementation is None and self.pack_sequences:
            return PACKED_ATTENTION
        return self.attn_implementation

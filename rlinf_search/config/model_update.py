"""The ``actor``, ``critic`` and ``inference`` sections of the training config model (``config/model.py``): how the
policy and the value model train, and where the log-probs are computed."""

from __future__ import annotations

from pydantic import Field

from rlinf_search.config.precision import Precision
from rlinf_search.section_model import ConfigSection
from rlinf_search.workers.actor.config import LrSchedSection, OptimSection
from rlinf_search.workers.actor.megatron.config import (
    CheckpointConverterConfig,
    MegatronBackendKeys,
    MegatronModelKeys,
)


class ActorModelSection(MegatronModelKeys):
    """``actor.model``: how the actor's models are built."""

    precision: Precision = "float32"
    """Compute precision, ``fp32`` or ``bf16`` (parameters, gradients and optimizer state are fp32 either way)."""
    enable_gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward."""
    use_remove_padding: bool = True
    """A micro-batch's rows go through the model as one packed sequence, so no padding token is computed."""
    attn_implementation: str | None = None
    """The HF attention kernel of the actor's models; null: ``sdpa_varlen`` when packing, else transformers'."""
    share_prompts: bool = False
    """Rows of one prompt in a pass go through the model as one sequence, the prompt once, each response attending
    to it and to itself; mini-batches then hold whole groups. Needs padded rows (``use_remove_padding: false``) and
    ``sdpa``."""
    compile_layers: bool = False
    """Compile each decoder layer with ``torch.compile`` (``fsdp`` and ``ddp``)."""
    logprob_chunk_size: int = Field(1024, ge=1)
    """Response tokens per LM-head chunk when computing log-probs."""


class FsdpSection(ConfigSection):
    """``actor.fsdp_config``."""

    cpu_offload: bool = False
    """FSDP2 keeps parameter and optimizer shards in CPU memory and moves each layer to the GPU for its compute."""


class MegatronSection(MegatronBackendKeys):
    """``actor.megatron``: read by ``actor.training_backend: megatron`` only."""

    use_hf_ckpt: bool = True
    """Start from the HF checkpoint at ``rollout.model.model_path`` (only true: convert a Megatron checkpoint with
    ``toolkits/convert_megatron_to_hf.py`` first)."""
    ckpt_convertor: CheckpointConverterConfig = CheckpointConverterConfig()
    """The checkpoint converter's settings."""


class ActorSection(ConfigSection):
    """``actor``: the policy's training backend and model."""

    group_name: str = "ActorGroup"
    """The name the actor's worker group is launched under (logs, errors)."""
    training_backend: str = "fsdp"
    """``fsdp`` (FSDP2), ``ddp`` or ``megatron`` (megatron-core; GPUs only)."""
    pack_traj: bool = True
    """A multi-turn trajectory trains as one sequence; false: each model turn is its own sequence (RLinf's
    turn-level training)."""
    model: ActorModelSection = ActorModelSection()
    """How the actor's models are built."""
    fsdp_config: FsdpSection = FsdpSection()
    """FSDP2's settings."""
    megatron: MegatronSection | None = None
    """The megatron backend's settings."""
    offload_weight: bool = False
    """Move the weights off the device between the actor's phases."""
    offload_grad: bool = False
    """Move the gradients off the device between the actor's phases."""
    offload_optimizer: bool = False
    """Move the optimizer state off the device between the actor's phases."""
    optim: OptimSection = OptimSection()
    """AdamW."""
    lr_sched: LrSchedSection = LrSchedSection()
    """The learning-rate schedule."""


class CriticOptimSection(OptimSection):
    """``critic.optim``: the actor's keys; a value head from scratch takes a larger step."""

    lr: float = Field(1e-5, ge=0, le=1)
    """Peak learning rate of the value model."""


class CriticModelSection(ConfigSection):
    """``critic.model``."""

    model_path: str | None = Field(None, json_schema_extra={"default_words": "`rollout.model.model_path`"})
    """The value model's starting weights (default: the actor's)."""
    precision: Precision = "float32"
    """Compute precision (fp16 refused: no loss scaling)."""


class CriticSection(ConfigSection):
    """``critic``: the value model (GAE)."""

    use_critic_model: bool = False
    """Train a value model (only GAE reads it)."""
    group_name: str = "CriticGroup"
    """The critic's worker group name."""
    warmup_steps: int = Field(0, ge=0, json_schema_extra={"relation": "< the run's steps"})
    """Steps the critic trains before the actor does."""
    model: CriticModelSection = CriticModelSection()
    """The value model."""
    optim: CriticOptimSection = CriticOptimSection()
    """AdamW."""
    lr_sched: LrSchedSection = LrSchedSection()
    """The learning-rate schedule."""


class InferenceSection(ConfigSection):
    """``inference``: an InferenceGroup that computes log-probs apart from the actor."""

    group_name: str = "InferenceGroup"
    """The group's name."""
    load_from_actor: bool = True
    """Take weights from the actor at each sync."""

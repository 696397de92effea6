"""Typed settings of the Megatron backend: ``actor.model`` parallel/recompute keys and ``actor.megatron``.

Plain Python: ``validate_cfg`` builds these on a machine without megatron-core or GPUs, so a GPU
recipe can be checked anywhere; whether the backend can run is checked when the run starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlinf_search.section_model import ConfigSection


class MegatronModelKeys(ConfigSection):
    """The ``actor.model`` keys read by ``actor.training_backend: megatron`` only (an FSDP run naming one is refused:
    it would do nothing)."""

    config_path = "actor.model"

    tensor_model_parallel_size: int = Field(1, ge=1)
    """Ranks one layer is split across; the rest of the actor's ranks are data parallel. 2 suits a
    3B model on 80 GB GPUs with room for long rollouts; it must divide the key/value heads."""
    pipeline_model_parallel_size: int = Field(1, ge=1)
    """Pipeline stages. Only 1: pipelining needs Megatron's pipeline schedules, which this backend
    does not drive (tensor parallelism covers models up to about 14B on 8 GPUs)."""
    sequence_parallel: bool = False
    """Split norm and dropout activations along the sequence across the tensor-parallel ranks. Only
    false: megatron-core's local layer spec (used here, no Transformer Engine) refuses it."""
    recompute_granularity: Literal["full", "selective"] | None = None
    """Activation recompute: null, ``full`` (whole layers; least memory) or ``selective`` (the
    attention core only; cheap, the default choice once sequences are long)."""
    recompute_method: Literal["uniform", "block"] | None = None
    """With ``full``: ``uniform`` (groups of ``recompute_num_layers``) or ``block`` (the first
    ``recompute_num_layers`` layers of each stage)."""
    recompute_num_layers: int | None = Field(None, ge=1)
    """With ``full``: the layer count ``recompute_method`` uses."""


class MegatronBackendKeys(ConfigSection):
    """The ``actor.megatron`` keys the backend reads as they are."""

    config_path = "actor.megatron"

    distributed_timeout_minutes: int = Field(30, ge=1)
    """Collective timeout of the actor's process group and of megatron-core's tensor/data-parallel groups
    (checkpoint gathers of a large model are slow)."""
    core_attention: Literal["local", "sdpa"] = "local"
    """``local`` (megatron-core's ``DotProductAttention``: a ``[b x heads, L, L]`` score buffer and an fp32 softmax
    per layer) or ``sdpa`` (``megatron/sdpa_attention.py``: torch's fused attention, no score matrix kept; untested
    on GPU)."""


class CheckpointConverterConfig(ConfigSection):
    """``actor.megatron.ckpt_convertor``: what ``toolkits/convert_megatron_to_hf.py --config`` reads."""

    config_path = "actor.megatron.ckpt_convertor"

    hf_model_path: str | None = Field(None, json_schema_extra={"default_words": "`rollout.model.model_path`"})
    """HF model directory whose ``config.json`` describes the architecture and whose tokenizer is
    copied next to the converted weights (default: ``rollout.model.model_path``)."""
    save_path: str | None = None
    """Where the converted HF model goes (the CLI's ``--save-path`` wins)."""
    tensor_model_parallel_size: int = Field(1, ge=1, json_schema_extra={
        "default_words": "`actor.model.tensor_model_parallel_size`"})
    """Tensor-parallel shards the Megatron checkpoint is expected to hold (checked against its folders)."""
    pipeline_model_parallel_size: int = Field(1, ge=1, json_schema_extra={
        "default_words": "`actor.model.pipeline_model_parallel_size`"})
    """Pipeline stages the Megatron checkpoint is expected to hold (checked against its folders)."""


class MegatronConfig(MegatronModelKeys, MegatronBackendKeys):
    """How the Megatron actor splits and recomputes the model (``actor.model`` and ``actor.megatron``); built by
    ``config/training.py``, and checked here for what only this backend cannot do."""

    converter: CheckpointConverterConfig | None = None
    """``actor.megatron.ckpt_convertor``, its paths and sizes filled from the run."""

    @model_validator(mode="after")
    def _check(self) -> MegatronConfig:
        if self.pipeline_model_parallel_size != 1:
            raise ValueError("actor.model.pipeline_model_parallel_size must be 1: this Megatron backend "
                             "does not drive pipeline schedules; use tensor_model_parallel_size")
        if self.sequence_parallel:
            raise ValueError("actor.model.sequence_parallel must be false: it needs Transformer Engine layer "
                             "specs, and this backend builds megatron-core's local (plain torch) spec")
        if self.recompute_granularity == "full":
            if self.recompute_method not in ("uniform", "block") or not self.recompute_num_layers:
                raise ValueError("actor.model.recompute_granularity full needs recompute_method "
                                 "(uniform or block) and recompute_num_layers >= 1")
        elif self.recompute_method is not None or self.recompute_num_layers is not None:
            raise ValueError("actor.model.recompute_method / recompute_num_layers apply to "
                             "recompute_granularity: full only")
        return self

    @property
    def process_group_timeout_s(self) -> float:
        return 60.0 * self.distributed_timeout_minutes

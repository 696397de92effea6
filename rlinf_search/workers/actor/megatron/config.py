"""Typed settings of the Megatron backend: ``actor.model`` parallel/recompute keys and ``actor.megatron``.

Plain Python: ``validate_cfg`` builds these on a machine without megatron-core or GPUs, so a GPU
recipe can be checked anywhere; whether the backend can run is checked when the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass


# Built from ``actor.model``'s Megatron keys and ``actor.megatron`` (``config/training.py``; their types and ranges
# are declared in ``config/model.py``); __post_init__ checks what only this backend cannot do.


@dataclass(frozen=True)
class CheckpointConverterConfig:
    """``actor.megatron.ckpt_convertor``: what ``toolkits/convert_megatron_to_hf.py --config`` reads."""

    hf_model_path: str
    """HF model directory whose ``config.json`` describes the architecture and whose tokenizer is
    copied next to the converted weights (default: ``rollout.model.model_path``)."""
    save_path: str | None = None
    """Where the converted HF model goes (the CLI's ``--save-path`` wins)."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel shards the Megatron checkpoint is expected to hold (checked against its folders)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline stages the Megatron checkpoint is expected to hold (checked against its folders)."""


@dataclass(frozen=True)
class MegatronConfig:
    """How the Megatron actor splits and recomputes the model (``actor.model`` and ``actor.megatron``)."""

    tensor_model_parallel_size: int = 1
    """Ranks one layer is split across; the rest of the actor's ranks are data parallel. 2 suits a
    3B model on 80 GB GPUs with room for long rollouts; it must divide the key/value heads."""
    pipeline_model_parallel_size: int = 1
    """Pipeline stages. Only 1: pipelining needs Megatron's pipeline schedules, which this backend
    does not drive (tensor parallelism covers models up to about 14B on 8 GPUs)."""
    sequence_parallel: bool = False
    """Split norm and dropout activations along the sequence across the tensor-parallel ranks. Only
    false: megatron-core's local layer spec (used here, no Transformer Engine) refuses it."""
    recompute_granularity: str | None = None
    """Activation recompute: None, ``full`` (whole layers; least memory) or ``selective`` (the
    attention core only; cheap, the default choice once sequences are long)."""
    recompute_method: str | None = None
    """With ``full``: ``uniform`` (groups of ``recompute_num_layers``) or ``block`` (the first
    ``recompute_num_layers`` layers of each stage)."""
    recompute_num_layers: int | None = None
    """With ``full``: the layer count ``recompute_method`` uses."""
    distributed_timeout_minutes: int = 30
    """Collective timeout of the actor's process group and of megatron-core's tensor/data-parallel groups
    (checkpoint gathers of a large model are slow)."""
    converter: CheckpointConverterConfig | None = None
    """``actor.megatron.ckpt_convertor``."""
    core_attention: str = "local"
    """``actor.megatron.core_attention``: ``local`` (megatron-core's ``DotProductAttention``: a ``[b x heads, L, L]``
    score buffer and an fp32 softmax per layer) or ``sdpa`` (``megatron/sdpa_attention.py``: torch's fused
    attention, no score matrix kept; untested on GPU)."""

    def __post_init__(self) -> None:
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

    @property
    def process_group_timeout_s(self) -> float:
        return 60.0 * self.distributed_timeout_minutes

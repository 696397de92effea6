"""Typed settings of the Megatron backend: ``actor.model`` parallel/recompute keys and ``actor.megatron``.

Plain Python: ``validate_cfg`` builds these on a machine without megatron-core or GPUs, so a GPU
recipe can be checked anywhere; whether the backend can run is checked when the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The actor.model keys only this backend reads (an FSDP run naming them would be silently ignored).
MODEL_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
              "recompute_granularity", "recompute_method", "recompute_num_layers")
MEGATRON_KEYS = ("use_hf_ckpt", "distributed_timeout_minutes", "ckpt_convertor", "core_attention")
CORE_ATTENTIONS = ("local", "sdpa")
CONVERTER_KEYS = ("hf_model_path", "save_path", "tensor_model_parallel_size", "pipeline_model_parallel_size")


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
        if self.tensor_model_parallel_size < 1:
            raise ValueError("actor.model.tensor_model_parallel_size must be >= 1")
        if self.pipeline_model_parallel_size != 1:
            raise ValueError("actor.model.pipeline_model_parallel_size must be 1: this Megatron backend "
                             "does not drive pipeline schedules; use tensor_model_parallel_size")
        if self.sequence_parallel:
            raise ValueError("actor.model.sequence_parallel must be false: it needs Transformer Engine layer "
                             "specs, and this backend builds megatron-core's local (plain torch) spec")
        if self.recompute_granularity not in (None, "full", "selective"):
            raise ValueError("actor.model.recompute_granularity must be null, full or selective, "
                             f"got {self.recompute_granularity!r}")
        if self.recompute_granularity == "full":
            if self.recompute_method not in ("uniform", "block") or not self.recompute_num_layers:
                raise ValueError("actor.model.recompute_granularity full needs recompute_method "
                                 "(uniform or block) and recompute_num_layers >= 1")
        elif self.recompute_method is not None or self.recompute_num_layers is not None:
            raise ValueError("actor.model.recompute_method / recompute_num_layers apply to "
                             "recompute_granularity: full only")
        if self.distributed_timeout_minutes < 1:
            raise ValueError("actor.megatron.distributed_timeout_minutes must be >= 1")

    @property
    def process_group_timeout_s(self) -> float:
        return 60.0 * self.distributed_timeout_minutes


def _section(body: Any, path: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ValueError(f"{path}: expected a section of keys, got {type(body).__name__}")
    unknown = sorted(set(body) - set(keys))
    if unknown:
        raise ValueError(f"{path}.{unknown[0]}: unknown key; {path} takes {', '.join(sorted(keys))}")
    return {key: value for key, value in body.items() if value is not None}


def megatron_config_from_actor(actor: dict[str, Any], *, default_hf_model_path: str) -> MegatronConfig:
    """Build ``MegatronConfig`` from the raw ``actor`` section; ValueError naming the key on a bad value."""
    model = {k: v for k, v in (actor.get("model") or {}).items() if k in MODEL_KEYS and v is not None}
    megatron = _section(actor.get("megatron"), "actor.megatron", MEGATRON_KEYS)
    if not megatron.get("use_hf_ckpt", True):
        raise ValueError("actor.megatron.use_hf_ckpt must be true: the Megatron actor starts from the HF "
                         "weights at rollout.model.model_path (convert a Megatron checkpoint with "
                         "toolkits/convert_megatron_to_hf.py first)")
    converter = _section(megatron.get("ckpt_convertor"), "actor.megatron.ckpt_convertor", CONVERTER_KEYS)
    tp = int(model.get("tensor_model_parallel_size", 1))
    pp = int(model.get("pipeline_model_parallel_size", 1))
    converter_config = CheckpointConverterConfig(
        hf_model_path=str(converter.get("hf_model_path", default_hf_model_path)),
        save_path=converter.get("save_path"),
        tensor_model_parallel_size=int(converter.get("tensor_model_parallel_size", tp)),
        pipeline_model_parallel_size=int(converter.get("pipeline_model_parallel_size", pp)))
    recompute_layers = model.get("recompute_num_layers")
    return MegatronConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        sequence_parallel=bool(model.get("sequence_parallel", False)),
        recompute_granularity=model.get("recompute_granularity"), recompute_method=model.get("recompute_method"),
        recompute_num_layers=None if recompute_layers is None else int(recompute_layers),
        distributed_timeout_minutes=int(megatron.get("distributed_timeout_minutes", 30)), converter=converter_config,
        core_attention=str(megatron.get("core_attention", MegatronConfig.core_attention)))

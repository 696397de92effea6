"""Typed settings of the Megatron backend: ``actor.model`` parallel/recompute keys and ``actor.megatron``.

Plain Python: ``validate_cfg`` builds these on a machine without megatron-core or GPUs, so a GPU
recipe can be checked anywhere; whether the backend can run is checked when the run starts.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

from rlinf_search.key_declarations import BOOL, STR, Choice, Int, declared

# The actor.model keys only this backend reads (an FSDP run naming them would be silently ignored); MegatronConfig's
# other declared fields are actor.megatron's. Each key's type and range are declared on its field (``declared``) and
# checked from the config before this is built; __post_init__ checks what only this backend cannot do.
MODEL_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
              "recompute_granularity", "recompute_method", "recompute_num_layers")
CORE_ATTENTIONS = ("local", "sdpa")


@dataclass(frozen=True)
class CheckpointConverterConfig:
    """``actor.megatron.ckpt_convertor``: what ``toolkits/convert_megatron_to_hf.py --config`` reads."""

    hf_model_path: str = declared(MISSING, STR)
    """HF model directory whose ``config.json`` describes the architecture and whose tokenizer is
    copied next to the converted weights (default: ``rollout.model.model_path``)."""
    save_path: str | None = declared(None, STR)
    """Where the converted HF model goes (the CLI's ``--save-path`` wins)."""
    tensor_model_parallel_size: int = declared(1, Int(ge=1))
    """Tensor-parallel shards the Megatron checkpoint is expected to hold (checked against its folders)."""
    pipeline_model_parallel_size: int = declared(1, Int(ge=1))
    """Pipeline stages the Megatron checkpoint is expected to hold (checked against its folders)."""


@dataclass(frozen=True)
class MegatronConfig:
    """How the Megatron actor splits and recomputes the model (``actor.model`` and ``actor.megatron``)."""

    tensor_model_parallel_size: int = declared(1, Int(ge=1))
    """Ranks one layer is split across; the rest of the actor's ranks are data parallel. 2 suits a
    3B model on 80 GB GPUs with room for long rollouts; it must divide the key/value heads."""
    pipeline_model_parallel_size: int = declared(1, Int(ge=1))
    """Pipeline stages. Only 1: pipelining needs Megatron's pipeline schedules, which this backend
    does not drive (tensor parallelism covers models up to about 14B on 8 GPUs)."""
    sequence_parallel: bool = declared(False, BOOL)
    """Split norm and dropout activations along the sequence across the tensor-parallel ranks. Only
    false: megatron-core's local layer spec (used here, no Transformer Engine) refuses it."""
    recompute_granularity: str | None = declared(None, Choice("full", "selective"))
    """Activation recompute: None, ``full`` (whole layers; least memory) or ``selective`` (the
    attention core only; cheap, the default choice once sequences are long)."""
    recompute_method: str | None = declared(None, Choice("uniform", "block"))
    """With ``full``: ``uniform`` (groups of ``recompute_num_layers``) or ``block`` (the first
    ``recompute_num_layers`` layers of each stage)."""
    recompute_num_layers: int | None = declared(None, Int(ge=1))
    """With ``full``: the layer count ``recompute_method`` uses."""
    distributed_timeout_minutes: int = declared(30, Int(ge=1))
    """Collective timeout of the actor's process group and of megatron-core's tensor/data-parallel groups
    (checkpoint gathers of a large model are slow)."""
    converter: CheckpointConverterConfig | None = None
    """``actor.megatron.ckpt_convertor``."""
    core_attention: str = declared("local", Choice(*CORE_ATTENTIONS))
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


def _present(section: Any) -> dict[str, Any]:
    """A section's non-null values (null: the field's default)."""
    return {key: value for key, value in (section or {}).items() if value is not None}


def megatron_config_from_actor(actor: dict[str, Any], *, default_hf_model_path: str) -> MegatronConfig:
    """Build ``MegatronConfig`` from the raw ``actor`` section, whose keys, types and ranges were checked against
    their declarations already (``check_keys`` and ``check_values`` of ``SCHEMA["actor"]``); ValueError naming the
    key for what only this backend refuses."""
    model = {key: value for key, value in _present(actor.get("model")).items() if key in MODEL_KEYS}
    megatron = _present(actor.get("megatron"))
    if not megatron.pop("use_hf_ckpt", True):
        raise ValueError("actor.megatron.use_hf_ckpt must be true: the Megatron actor starts from the HF "
                         "weights at rollout.model.model_path (convert a Megatron checkpoint with "
                         "toolkits/convert_megatron_to_hf.py first)")
    converter = {"hf_model_path": default_hf_model_path,
                 "tensor_model_parallel_size": model.get("tensor_model_parallel_size", 1),
                 "pipeline_model_parallel_size": model.get("pipeline_model_parallel_size", 1),
                 **_present(megatron.pop("ckpt_convertor", None))}
    return MegatronConfig(**model, **megatron, converter=CheckpointConverterConfig(**converter))

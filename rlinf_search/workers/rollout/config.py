"""``RolloutConfig``: the typed view of the ``rollout`` section (which engine, which weights, how much memory).

``validate_cfg`` builds it from the parsed ``rollout`` section (``config/model.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How the rollout engine is built and fed: every field but the weight sync's bucket size is read by an engine
    factory."""

    backend: str = "hf"
    """``rollout.rollout_backend``: ``hf`` (the CPU default), ``vllm``, or a dotted path to a factory."""
    model_path: str
    """``rollout.model.model_path``: a Hugging Face model directory (the starting policy)."""
    dtype: str = "auto"
    """``rollout.model.precision`` as a torch dtype name; ``auto``: bf16 on GPU, fp32 on CPU."""
    max_running_requests: int = 64
    """Most sequences an engine decodes at once (vLLM's ``max_num_seqs``)."""
    gpu_memory_utilization: float = 0.5
    """Read by vLLM only (its ``EngineTraits.own_keys``): share of the device's memory vLLM takes for weights and
    KV cache. Collocated with an FSDP actor, leave the rest to the actor; on CPU it is the share of RAM, and about
    0.3 suits a laptop."""
    tensor_parallel_size: int = 1
    """Devices one engine spans. Each rollout rank drives exactly one device in this build, so 1."""
    update_weights_bucket_megabytes: int = 256
    """``rollout.update_weights_bucket_megabytes``: the size of each bucket a weight sync streams to the engines
    (verl's key of the same name). Read by the weight sync, not the engine: the sender packs the next bucket while
    the engines load this one, and a receiver holds one bucket at a time."""
    seeded: bool = True
    """``rollout.seeded``: every request samples with its own seed, derived from the rank's checkpointed
    generator, so a resumed run replays the rollout exactly and a request's tokens do not depend on what it
    was batched with. false: requests draw from the engine's shared generator, which vLLM samples in one
    batched pass (seeded requests take its per-request-generator path); a resume then samples anew."""
    engine_settings: Any = None
    """``rollout.engine_settings`` validated by the settings model the engine's factory declares
    (``@with_settings``; the HF engine's: ``HFEngineSettings``), read by the factory; None for one that declares
    none."""

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("rollout.model.model_path is required")
        if self.tensor_parallel_size != 1:
            # A rank sees only its own device (CUDA_VISIBLE_DEVICES), so an engine cannot span several;
            # Qwen2.5-3B fits one GPU, and 8 GPUs run 8 data-parallel engines instead.
            raise ValueError(f"rollout.tensor_parallel_size: only 1 is supported (one engine per device), "
                             f"got {self.tensor_parallel_size}")

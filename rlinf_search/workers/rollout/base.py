"""The generation engine interface (token ids in, token ids out) and the registry of engines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.registry import Lazy, Registry

if TYPE_CHECKING:
    from rlinf_search.workers.rollout.config import RolloutConfig


class GenerationEngine(Protocol):
    """What the agent loop and the trainer need from any rollout engine (hf, vllm, sglang)."""

    weight_version: int
    """Bumped by every ``update_weights`` (the engine's own count). The version trajectories record is the weight
    sync's, stamped on each output by the rank's ``WeightGate`` (``weight_gate.py``), not this."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        """Continue ``prompt_ids``; return exactly the sampled ids and their log-probs (one version: the caller's
        gate never swaps weights while a request runs)."""
        ...

    def update_weights(self, state_dict: dict) -> None:
        """Load new policy weights (names as in the Hugging Face model)."""
        ...

    def offload(self) -> None:
        """Free the device memory the engine holds (collocated training needs it)."""
        ...

    def onload(self) -> None:
        """Bring the engine back after ``offload``."""
        ...

    async def aclose(self) -> None:
        """Stop background work and release resources."""
        ...


EngineFactory = Callable[..., GenerationEngine]
"""``factory(config: RolloutConfig, *, device: str | None, seed: int) -> GenerationEngine``."""

ROLLOUT_ENGINES: Registry[EngineFactory] = Registry("engine", unavailable={"sglang": "use vllm (GPU) or hf"})
"""Engine factories by the name ``rollout.rollout_backend`` uses (or a dotted path to one). The built-ins are
imported when first resolved: choosing hf never imports vLLM."""
ROLLOUT_ENGINES.register("hf", Lazy("rlinf_search.workers.rollout.hf_engine:build_hf_engine"))
ROLLOUT_ENGINES.register("vllm", Lazy("rlinf_search.workers.rollout.vllm_engine:build_vllm_engine"))


def register_engine(name: str, factory: EngineFactory, *, overwrite: bool = False) -> None:
    """Make an engine available as ``rollout.rollout_backend: <name>``."""
    ROLLOUT_ENGINES.register(name, factory, overwrite=overwrite)


def engine_factory(name: str) -> EngineFactory:
    """The factory of ``rollout.rollout_backend``: a registered name or a dotted path; ValueError otherwise."""
    return ROLLOUT_ENGINES.resolve(name)


def build_engine(config: RolloutConfig, *, device: str | None = None, seed: int = 0) -> GenerationEngine:
    """The engine ``config.backend`` names, loaded from ``config.model_path`` on ``device``."""
    return engine_factory(config.backend)(config, device=device, seed=seed)

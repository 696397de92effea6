"""The registry of generation engines (the interface they implement is ``agents.engine.GenerationEngine``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from rlinf_search.agents.engine import GenerationEngine
from rlinf_search.registry import Lazy, Registry

if TYPE_CHECKING:
    from rlinf_search.workers.rollout.config import RolloutConfig


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

"""The registry of generation engines (the interface they implement is ``agents.engine.GenerationEngine``) and
what each engine declares about itself (``EngineTraits``), which the config checks and the placement read instead of
an engine's name: a new engine registers (or is named by dotted path) with its traits and touches no other file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rlinf_search.agents.engine import GenerationEngine
from rlinf_search.registry import Lazy, Registry

if TYPE_CHECKING:
    from rlinf_search.workers.rollout.config import RolloutConfig


EngineFactory = Callable[..., GenerationEngine]
"""``factory(config: RolloutConfig, *, device: str | None, seed: int) -> GenerationEngine``."""


@dataclass(frozen=True)
class EngineTraits:
    """What an engine declares beside its factory (``register_engine(..., traits=...)``, or ``@engine_traits(...)``
    on a factory named by dotted path); an engine that declares nothing gets these defaults."""

    offloads_on: frozenset[str] = frozenset({"cpu", "cuda"})
    """Device kinds (``cpu``, ``cuda``) on which ``offload()`` releases the engine's memory between phases. On any
    other kind the rollout cannot share its devices with another component (the placement refuses it)."""
    filtered_logprobs: bool = False
    """Its log-probs are of the top-k/top-p filtered distribution (vLLM's), not the model's: training on them
    (``algorithm.recompute_logprobs: false``) then needs top_k 0 and top_p 1."""
    own_keys: tuple[str, ...] = ()
    """Keys of the ``rollout`` section that only this engine reads: written for another engine, they are refused
    rather than silently doing nothing."""


TRAITS_ATTRIBUTE = "engine_traits"
"""The attribute of a factory its traits are kept in (set by ``register_engine`` or ``@engine_traits``)."""


def engine_traits(**traits) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator declaring a factory's :class:`EngineTraits` (for one named by dotted path)."""
    declared = EngineTraits(**traits)

    def declare(factory: EngineFactory) -> EngineFactory:
        setattr(factory, TRAITS_ATTRIBUTE, declared)
        return factory

    return declare


ROLLOUT_ENGINES: Registry[EngineFactory] = Registry("engine", unavailable={"sglang": "use vllm (GPU) or hf"})
"""Engine factories by the name ``rollout.rollout_backend`` uses (or a dotted path to one). The built-ins are
imported when first resolved: choosing hf never imports vLLM."""
ROLLOUT_ENGINES.register("hf", Lazy("rlinf_search.workers.rollout.hf_engine:build_hf_engine"))
ROLLOUT_ENGINES.register("vllm", Lazy("rlinf_search.workers.rollout.vllm_engine:build_vllm_engine"))


def register_engine(name: str, factory: EngineFactory, *, traits: EngineTraits | None = None,
                    overwrite: bool = False) -> None:
    """Make an engine available as ``rollout.rollout_backend: <name>``, with its traits (else those it declared
    with ``@engine_traits``, else the defaults)."""
    if traits is not None:
        setattr(factory, TRAITS_ATTRIBUTE, traits)
    ROLLOUT_ENGINES.register(name, factory, overwrite=overwrite)


def engine_factory(name: str) -> EngineFactory:
    """The factory of ``rollout.rollout_backend``: a registered name or a dotted path; ValueError otherwise."""
    return ROLLOUT_ENGINES.resolve(name)


def traits_of(name: str) -> EngineTraits:
    """The traits of the engine ``rollout.rollout_backend`` names (resolving it imports a built-in's module, which
    does not import its engine's package); ValueError for a name that does not resolve."""
    return getattr(engine_factory(name), TRAITS_ATTRIBUTE, EngineTraits())


def build_engine(config: RolloutConfig, *, device: str | None = None, seed: int = 0) -> GenerationEngine:
    """The engine ``config.backend`` names, loaded from ``config.model_path`` on ``device``."""
    return engine_factory(config.backend)(config, device=device, seed=seed)

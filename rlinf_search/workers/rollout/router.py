"""Routing an agent loop's generate requests over several engine servers.

With ``agentloop.num_workers`` >= 1 the engines are token-in/token-out servers (``EngineServerWorker``, the
rollout group) and the agent loops run in their own group; each agent-loop rank sends its requests through
a ``RoutedEngine``. The router keeps every turn of a trajectory on the engine that served its first turn
(that engine's prefix cache holds the trajectory so far, so a later turn prefills only the new observation)
and sends a new trajectory to the engine with the fewest requests outstanding from this rank, so a server
slowed by long sequences gets fewer new ones. The counts are this rank's own, as in verl's server manager:
no cross-rank bookkeeping on the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlinf_search.agents.engine import TRAJECTORY, RouteSession
from rlinf_search.data.io_struct import GenerationOutput, SamplingParams


class EngineRouter:
    """Which engine serves a request: its trajectory's engine, else the one with the fewest outstanding."""

    def __init__(self, engines: int):
        if engines < 1:
            raise ValueError(f"EngineRouter needs at least one engine, got {engines}")
        self.outstanding = [0] * engines
        """Requests sent to each engine and not yet answered (this router's)."""
        self.assigned = [0] * engines
        """Trajectories (or unsessioned requests) each engine was given."""

    def acquire(self, session: RouteSession | None) -> int:
        """The engine for the next request of ``session``'s trajectory, counted outstanding until ``release``."""
        engine = session.engine if session is not None else None
        if engine is None:
            # Ties go to the engine given the fewest trajectories, then the lowest index: a burst of new
            # trajectories at a step's start is dealt round-robin rather than all to engine 0.
            engine = min(range(len(self.outstanding)), key=lambda e: (self.outstanding[e], self.assigned[e], e))
            self.assigned[engine] += 1
            if session is not None:
                session.engine = engine
        self.outstanding[engine] += 1
        return engine

    def release(self, engine: int) -> None:
        """The request sent to ``engine`` is answered (or failed)."""
        self.outstanding[engine] -= 1


class RoutedEngine:
    """The ``GenerationEngine`` of an agent-loop rank: each request goes to an engine server the router picks.

    Weights, offload and onload are the engine servers' business (the driver calls them); here they are
    refused, so a runner that forgot the servers fails loudly instead of updating nothing."""

    def __init__(self, servers: Sequence, tokenizer):
        """``servers``: Ray actor handles of the rollout group's ``EngineServerWorker`` ranks."""
        self.servers = list(servers)
        self.tokenizer = tokenizer
        self.router = EngineRouter(len(self.servers))
        self.weight_version = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        engine = self.router.acquire(TRAJECTORY.get())
        try:
            return await self.servers[engine].generate.remote(prompt_ids, sampling)
        finally:
            self.router.release(engine)

    def update_weights(self, state_dict: dict) -> None:
        raise RuntimeError("a RoutedEngine holds no weights: sync them to the engine servers (the rollout group)")

    def offload(self) -> None:
        raise RuntimeError("a RoutedEngine holds no device memory: offload the engine servers (the rollout group)")

    def onload(self) -> None:
        raise RuntimeError("a RoutedEngine holds no device memory: onload the engine servers (the rollout group)")

    async def aclose(self) -> None:
        pass

"""A rank of the rollout group as a token-in/token-out server (``agentloop.num_workers`` >= 1).

The engine serves ``generate`` calls from every agent-loop rank at once (a Ray async actor: one event loop,
so concurrent requests meet in the engine's running batch), and takes weights, offload and onload from the
driver as an inline rollout rank does. It knows nothing of prompts, tools or trajectories.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import torch

from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.scheduler import Worker
from rlinf_search.workers.rollout.base import build_engine
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.workers.rollout.weight_gate import GatedEngine, WeightGate


class EngineServerWorker(Worker):
    """One engine on one device, answering ``generate`` for the agent-loop group's routers."""

    def __init__(self, rollout: RolloutConfig, seed: int):
        """``seed``: ``data.seed``; rank r's engine samples unseeded requests from seed + r."""
        self.engine = build_engine(rollout, device=self.device, seed=seed + self.rank)
        self.gate = WeightGate()
        self._gated = GatedEngine(self.engine, self.gate)
        self.weight_version = 0
        self.served = 0
        """Requests answered, for tests and metrics."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        """Continue ``prompt_ids``: exactly the sampled ids and their log-probs, stamped with the policy version."""
        out = await self._gated.generate(prompt_ids, sampling)
        self.served += 1
        return out

    async def stats(self) -> dict[str, int]:
        return {"served": self.served, "weight_version": self.weight_version}

    async def engine_activity(self) -> dict:
        """The engine's ``EngineActivity`` as a dict (``RolloutWorker.engine_activity``)."""
        return asdict(self.gate.activity())

    async def _weight_sync_receive(self, sync_id: str) -> int:
        # The actor's event loop keeps serving the requests in flight while the gate waits for them and the
        # buckets stream in (in a thread): an asynchronous run syncs weights while agent loops generate.
        return await asyncio.to_thread(Worker._weight_sync_receive, self, sync_id)

    # Plain methods: the driver calls offload and onload between rollouts, when no request is in flight.
    def set_weights(self, state_dict: dict, version: int) -> None:
        self.set_weight_buckets(iter([state_dict]), version)

    def set_weight_buckets(self, buckets, version: int) -> None:
        self._gated.load_weights(buckets, version)
        self.weight_version = version

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()

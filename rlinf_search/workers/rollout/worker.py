"""A rank of the RolloutGroup: a generation engine and the Search-R1 agent loop that drives it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import torch

from rlinf_search.agents.searchr1.loop import AgentLoopConfig, SearchR1AgentLoop
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.scheduler import Worker
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.base import build_engine
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.workers.tool.remote import GroupSearchTool


class RolloutWorker(Worker):
    """Generates trajectories for its share of the prompts; takes new weights from the actor."""

    def __init__(self, rollout: RolloutConfig, agent_loop: AgentLoopConfig, search: SearchToolConfig, seed: int):
        """``seed``: ``data.seed``; rank r samples from seed + r."""
        self.agent_loop, self.search = agent_loop, search
        self.seeded = rollout.seeded
        self.engine = build_engine(rollout, device=self.device, seed=seed + self.rank)
        self.weight_version = 0
        # Each rollout call draws one seed from here and every request of the call derives its own
        # from it; so this generator's state is the whole sampling state of the rank, and a
        # checkpoint that stores it replays the next rollout exactly.
        self.seeds = torch.Generator().manual_seed(seed + self.rank)
        self.search_actors: list = []
        """The SearchTool group's ranks (``use_search_group``); empty: a client of this rank's own per call."""

    def use_search_group(self, actors: list) -> None:
        """Search through the SearchTool group's ranks from now on (``tools.search.num_workers`` >= 1)."""
        self.search_actors = list(actors)

    def _search_tool(self):
        if self.search_actors:
            return GroupSearchTool(self.search_actors)
        # The search client's connections belong to one event loop: one client per call.
        return build_search_tool(self.search)

    def rollout(self, records: list[QARecord], samples_per_prompt: int, greedy: bool = False) -> list[Trajectory]:
        """Roll out ``records`` (``samples_per_prompt`` each) with a fresh search client for this call."""
        loop_config = self.agent_loop
        if greedy:
            loop_config = replace(loop_config, sampling=replace(loop_config.sampling, greedy=True))
        seed = int(torch.randint(0, 2**62, (1,), generator=self.seeds))  # drawn either way: resumes stay aligned
        if not self.seeded:
            seed = None  # rollout.seeded false: the engine's own generator samples every request

        async def run() -> list[Trajectory]:
            tool = self._search_tool()
            try:
                loop = SearchR1AgentLoop(self.engine, tool, self.engine.tokenizer, loop_config)
                return await loop.run_batch(records, samples_per_prompt, seed=seed)
            finally:
                await tool.aclose()

        return asyncio.run(run())

    def set_weights(self, state_dict: dict, version: int) -> None:
        # Tensors from shared memory are read-only views: load_state_dict copies them into the model.
        self.engine.update_weights({name: torch.as_tensor(value) for name, value in state_dict.items()})
        self.weight_version = version

    def rng_state(self) -> list[int]:
        """The sampling state of this rank, for a checkpoint (the generator's bytes)."""
        return self.seeds.get_state().tolist()

    def set_rng_state(self, state: list[int]) -> None:
        self.seeds.set_state(torch.tensor(state, dtype=torch.uint8))

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()

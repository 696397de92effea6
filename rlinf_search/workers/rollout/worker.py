"""A rank of the RolloutGroup: a generation engine and the Search-R1 agent loop that drives it."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import asdict, replace

import torch

from rlinf_search.agents import build_agent_loop
from rlinf_search.agents.base import GroupCallback
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.data.io_struct import FinishedGroup, QARecord, Trajectory
from rlinf_search.scheduler import Worker
from rlinf_search.scheduler.channel import Channel
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.base import build_engine
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.workers.rollout.weight_gate import GatedEngine, WeightGate
from rlinf_search.workers.tool.remote import GroupSearchTool


class RolloutWorker(Worker):
    """Generates trajectories for its share of the prompts; takes new weights from the actor.

    In an asynchronous run the rank is a threaded actor: rollout calls of several steps run at once (each its
    own event loop, all on the one engine) and the weight sync arrives on another thread; the engine's
    ``WeightGate`` swaps the weights at a token boundary (``weight_gate.py``)."""

    def __init__(self, rollout: RolloutConfig, agent_loop: AgentLoopConfig, search: SearchToolConfig, seed: int):
        """``seed``: ``data.seed``; rank r samples from seed + r."""
        self._init_sampling(rollout, agent_loop, search, seed)
        self.engine = build_engine(rollout, device=self.device, seed=seed + self.rank)
        self.gate = WeightGate()

    def _init_sampling(self, rollout: RolloutConfig, agent_loop: AgentLoopConfig, search: SearchToolConfig,
                       seed: int) -> None:
        """Everything of a rank but its engine: the loop's config, the search tool, the sampling state."""
        self.agent_loop, self.search = agent_loop, search
        self.seeded = rollout.seeded
        self.weight_version = 0
        # Each rollout call draws one seed from here and every request of the call derives its own
        # from it; so this generator's state is the whole sampling state of the rank, and a
        # checkpoint that stores it replays the next rollout exactly.
        self.seeds = torch.Generator().manual_seed(seed + self.rank)
        self._seeds_lock = threading.Lock()  # rollout calls of several steps may start at once (async)
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
        return self._rollout(records, samples_per_prompt, greedy=greedy)

    def stream_rollout(self, records: list[QARecord], samples_per_prompt: int, channel: Channel, key: str,
                       group_indices: list[int], batch_seed: int | None = None) -> int:
        """``rollout``, putting each finished group on ``channel`` under ``key`` as a ``FinishedGroup`` (its
        index in the step is ``group_indices`` at its place in ``records``) the moment its last sample is done.
        Seeds and tokens are those ``rollout`` would give, or, with ``batch_seed``, derived from it instead of the
        rank's generator (an asynchronous run's batches start on the rank in no fixed order, so each brings its
        own). Returns the number of groups put."""
        async def hand_on(i: int, trajectories: list[Trajectory]) -> None:
            await channel.aput(FinishedGroup(index=group_indices[i], rank=self.rank, trajectories=trajectories), key)

        self._rollout(records, samples_per_prompt, greedy=False, on_group=hand_on, batch_seed=batch_seed)
        return len(records)

    def _rollout(self, records: list[QARecord], samples_per_prompt: int, *, greedy: bool,
                 on_group: GroupCallback | None = None, batch_seed: int | None = None) -> list[Trajectory]:
        loop_config = self.agent_loop
        if greedy:
            loop_config = replace(loop_config, sampling=replace(loop_config.sampling, greedy=True))
        seed = batch_seed
        if seed is None:
            with self._seeds_lock:
                seed = int(torch.randint(0, 2**62, (1,), generator=self.seeds))  # drawn either way: resumes align
        if not self.seeded:
            seed = None  # rollout.seeded false: the engine's own generator samples every request

        async def run() -> list[Trajectory]:
            tool = self._search_tool()
            loop = None
            try:
                engine = self._loop_engine()
                loop = build_agent_loop(engine, tool, engine.tokenizer, loop_config)
                return await loop.run_batch(records, samples_per_prompt, seed=seed, on_group=on_group)
            finally:
                if loop is not None:
                    await loop.aclose()
                await tool.aclose()

        return asyncio.run(run())

    def _loop_engine(self):
        """The engine the agent loops generate with: this rank's own, behind its weight gate."""
        return GatedEngine(self.engine, self.gate)

    def set_weights(self, state_dict: dict, version: int) -> None:
        self.set_weight_buckets(iter([state_dict]), version)

    def set_weight_buckets(self, buckets, version: int) -> None:
        # The gate closes first and the requests in flight end at a token boundary, then the buckets stream into the
        # engine as the transport delivers them: the rank never holds a second copy of the model.
        GatedEngine(self.engine, self.gate).load_weights(buckets, version)
        self.weight_version = version

    def engine_activity(self) -> dict:
        """The engine's ``EngineActivity`` as a dict: its version, seconds busy, requests admitted and in flight."""
        return asdict(self.gate.activity())

    def rng_state(self) -> list[int]:
        """The sampling state of this rank, for a checkpoint (the generator's bytes)."""
        return self.seeds.get_state().tolist()

    def set_rng_state(self, state: list[int]) -> None:
        self.seeds.set_state(torch.tensor(state, dtype=torch.uint8))

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()

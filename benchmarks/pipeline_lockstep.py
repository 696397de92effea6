"""Search-R1's lock-step rollout, for ``benchmarks/pipeline.py``'s ``lockstep`` mode: the baseline RLinf's
"55 % faster" is measured against.

Search-R1 (``search_r1/llm_agent/generation.py``, ``run_llm_loop``) rolls a batch out turn by turn: one generate
call over every active trajectory on all GPUs, which returns when the slowest sequence of the turn is done; then
one HTTP request to the retriever with every query of the turn; then the next turn. ``LockstepAgentLoop`` runs
that schedule inside this runtime's rollout ranks, with the same simulated engine, trainer and retriever as the
other modes, so only Search-R1's own differences separate it from ``sync``:

- a global barrier per turn across every rollout rank (``TurnBarrier``, a Ray actor the ranks meet at), with
  the turn's searches answered by one batched retrieval of all of them there;
- ``LOCKSTEP_MODEL``: the engine and trainer settings of Search-R1's recipe (each with its source below).

Trajectories are those ``sync`` samples: the same per-trajectory seeds (``derive_seed(seed, index)``), the same
simulated turns.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import ray

from benchmarks.service_model import Trace, read_settings
from rlinf_search.agents.engine import derive_seed
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.agents.tools import as_tools
from rlinf_search.data.io_struct import QARecord, Trajectory
from rlinf_search.tools.search.base import SearchHit, SearchOutcome

LOCKSTEP_MODEL = {
    # Search-R1 verl/trainer/config/ppo_trainer.yaml, rollout.free_cache_engine: True: the KV cache is freed after
    # every generate call, so each turn prefills the trajectory's whole context again.
    "prefix_cache": False,
    # ppo_trainer.yaml, rollout.max_num_seqs: 1024 (this runtime's GPU recipe: 256).
    "max_running_requests": 1024,
    # train_grpo.sh: actor fsdp_config param_offload, grad_offload, optimizer_offload all true: the actor's
    # 3.09e9 fp32 parameters, gradients and Adam moments (49 GB, 6 GB a rank) cross PCIe both ways each step;
    # 1 s at about 12 GB/s effective (assumption).
    "trainer_offload_s": 1.0,
}
"""``ServiceModel`` fields ``lockstep`` changes, and why; every other field is the other modes'.

The range ``benchmarks/pipeline.py`` runs around them: ``max_turns`` 2 (Search-R1's ``train_grpo.sh``) and 4 (the
other modes'), each with generation stopped at the action tag (as here) and without (``LOCKSTEP_NO_STOP``)."""

LOCKSTEP_NO_STOP = {"tokens_after_action": 0.25}
"""Search-R1's loop does not stop generation at ``</search>``: the text is cut after it. Its users report over
20 % of decoding wasted this way; 0.25 of a turn's tokens is an assumption after those reports."""

LOCKSTEP_FIT = {"decode_step_overhead_s": 0.020}
"""The one fitted figure, shown apart from the range: ppo_trainer.yaml, rollout.enforce_eager: True (no CUDA
graphs, every decode step launches each kernel of the 36 layers from Python). 20 ms a step instead of 4 is an
assumption, chosen so ``lockstep`` (4 turns, stopped at the tag) lands at RLinf's 133 s."""

BARRIER_NAME = "rlinf_search_lockstep_barrier"


@ray.remote(num_cpus=0)
class TurnBarrier:
    """Where the rollout ranks meet after each turn's generation: when all have arrived, every query of the turn
    is answered by one batched retrieval (the simulated retriever's time for all of them), then all go on."""

    def __init__(self, parties: int):
        self.parties = parties
        self.settings = read_settings()
        self.trace = Trace(self.settings, "search")
        self.rng = random.Random(0)
        self._arrived: dict[tuple, list[tuple[int, bool]]] = {}
        self._released: dict[tuple, asyncio.Event] = {}
        self._any_active: dict[tuple, bool] = {}

    async def turn(self, key: tuple, queries: int, active: bool) -> bool:
        """``key``: (the rank's call number, the turn); ``queries``: the rank's searches of the turn; ``active``:
        whether the rank still has trajectories. Returns whether any rank still has some."""
        arrived = self._arrived.setdefault(key, [])
        released = self._released.setdefault(key, asyncio.Event())
        arrived.append((queries, active))
        if len(arrived) == self.parties:
            total = sum(q for q, _ in arrived)
            if total:
                model = self.settings.model
                start = time.time()
                await asyncio.sleep(model.wall(model.search_s(total, self.rng)))
                self.trace.interval(start, time.time(), "retrieve", queries=total)
            self._any_active[key] = any(a for _, a in arrived)
            released.set()
        await released.wait()
        return self._any_active[key]


_BARRIER = None


def _barrier():
    """The run's one barrier (the first rank to ask creates it; each process keeps its handle, so it lives as long
    as the rollout ranks)."""
    global _BARRIER
    if _BARRIER is None:
        parties = int(os.environ.get("WORLD_SIZE", "1"))
        _BARRIER = TurnBarrier.options(name=BARRIER_NAME, get_if_exists=True).remote(parties)
    return _BARRIER


class LockstepAgentLoop(SearchR1AgentLoop):
    """``agent.protocol: benchmarks.pipeline_lockstep:LockstepAgentLoop``: Search-R1's turn-by-turn schedule."""

    _calls = 0
    """Rollout calls this process has made (the ranks make the same sequence of calls: one a step)."""

    def __init__(self, engine, tools, tokenizer, config):
        super().__init__(engine, tools, tokenizer, config)
        # The turn's searches are answered by the barrier's one retrieval: passages as the simulated retriever's.
        passage = " ".join(["the"] * read_settings().model.passage_words)
        self.tools = as_tools(_Answered([SearchHit(title=f"doc {i}", text=passage) for i in range(config.topk)]),
                              config, tokenizer)

    async def run_batch(self, records: list[QARecord], samples_per_prompt: int = 1, *, seed: int | None = None,
                        on_group=None) -> list[Trajectory]:
        if on_group is not None:
            raise RuntimeError("lockstep rolls out whole batches: use runner.pipeline sync")
        call = LockstepAgentLoop._calls
        LockstepAgentLoop._calls += 1
        barrier = _barrier()
        rollouts = []
        for index, record in enumerate(r for r in records for _ in range(samples_per_prompt)):
            rollout = self.start(record)
            rollout.seed = None if seed is None else derive_seed(seed, index)
            rollouts.append(rollout)
        turn = 0
        while True:
            active = [r for r in rollouts if not r.done]
            await asyncio.gather(*(self.generate_step(r) for r in active))
            searching = [r for r in active if not r.done]
            queries = sum(r.action.kind == "search" for r in searching)
            # Every rank waits here for the slowest sequence of the turn on any rank, and for the one retrieval.
            if not await barrier.turn.remote((call, turn), queries, bool(active)):
                break
            await asyncio.gather(*(self.observe_step(r) for r in searching))
            turn += 1
        return [self.finish(r) for r in rollouts]


class _Answered:
    """A search tool answering every query with the passages the barrier's batched retrieval stands for."""

    def __init__(self, hits: list[SearchHit]):
        self.hits = hits

    async def search(self, query: str, topk: int) -> SearchOutcome:
        return SearchOutcome(query=query, hits=list(self.hits[:topk]))

    async def aclose(self) -> None:
        pass

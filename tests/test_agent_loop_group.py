"""Engines as token-in/token-out servers, the AgentLoop group and its router (``agentloop.num_workers`` >= 1).

The router keeps every turn of a trajectory on the engine of its first turn and sends a new trajectory to the
engine with the fewest requests outstanding. Through a real Ray cluster: two engine-server ranks and two
agent-loop ranks roll out as two inline rollout ranks would, each trajectory on one engine, both engines used.
"""

from __future__ import annotations

import asyncio

import pytest

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.data.io_struct import GenerationOutput, QARecord, SamplingParams
from rlinf_search.tools.search import SearchToolConfig
from rlinf_search.workers.rollout.agent_loop_worker import AgentLoopWorker
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.agents.engine import RouteSession, routed_trajectory
from rlinf_search.workers.rollout.router import EngineRouter, RoutedEngine
from rlinf_search.workers.rollout.server import EngineServerWorker
from rlinf_search.workers.rollout.worker import RolloutWorker
from rlinf_search.scheduler.placement import host_placement


def test_a_trajectory_stays_on_its_engine_and_new_ones_go_to_the_least_loaded():
    router = EngineRouter(3)
    a, b, c, d = RouteSession(), RouteSession(), RouteSession(), RouteSession()
    assert [router.acquire(s) for s in (a, b, c)] == [0, 1, 2]  # a burst of new trajectories is dealt round
    router.release(1)  # engine 1 answered b's turn; a and c are still generating
    assert router.acquire(d) == 1, "the engine with nothing outstanding gets the new trajectory"
    assert router.acquire(a) == 0 and router.outstanding == [2, 1, 1], "a's next turn goes where a started"
    assert router.assigned == [1, 2, 1]
    # A request of no trajectory: the least loaded engine, the one given fewer trajectories on a tie.
    assert router.acquire(None) == 2 and router.assigned == [1, 2, 2]
    with pytest.raises(ValueError, match="at least one engine"):
        EngineRouter(0)


class _Server:
    """An engine server as a Ray handle looks to the router (``server.generate.remote(...)`` is awaitable);
    it answers at once with its own index, so the test sees where each turn went."""

    def __init__(self, index: int):
        self.index, self.generate = index, self

    def remote(self, prompt_ids, sampling):
        async def answer():
            await asyncio.sleep(0.001 * len(prompt_ids))  # longer contexts take longer, as on an engine
            return GenerationOutput([self.index], [0.0], "length", None)
        return answer()


def test_routed_turns_of_concurrent_trajectories_each_stay_on_one_engine():
    engine = RoutedEngine([_Server(i) for i in range(2)], tokenizer=None)

    async def trajectory(turns: int) -> list[int]:
        with routed_trajectory():
            return [(await engine.generate(list(range(t + 1)), SamplingParams())).output_ids[0] for t in range(turns)]

    async def run():
        return await asyncio.gather(*(trajectory(turns) for turns in (3, 1, 4, 2, 3, 1)))

    served = asyncio.run(run())
    assert all(len(set(engines)) == 1 for engines in served), served
    assert {engines[0] for engines in served} == {0, 1}
    assert engine.router.outstanding == [0, 0] and sum(engine.router.assigned) == 6
    with pytest.raises(RuntimeError, match="sync them to the engine servers"):
        engine.update_weights({})


def _records(n: int) -> list[QARecord]:
    return [QARecord(uid=f"q-{i}", prompt=[{"role": "user", "content": f"Question {i} about Lilu?"}],
                     golden_answers=["a spirit"], data_source="hotpotqa", question=f"Question {i}") for i in range(n)]


def _launch(cluster, rollout: RolloutConfig, loop: AgentLoopConfig, search: SearchToolConfig):
    engines = EngineServerWorker.create_group(rollout, 0).launch(cluster, cluster.placement["rollout"],
                                                                 name="RolloutGroup")
    loops = AgentLoopWorker.create_group(rollout, loop, search, 0).launch(cluster, host_placement("AgentLoopGroup", 2),
                                                                          name="AgentLoopGroup")
    loops.call(AgentLoopWorker.use_engines, list(engines.actors)).wait(timeout=120)
    return engines, loops


def _rollout(group, parts: list[list[QARecord]], samples: int) -> list:
    calls = [group.call_on(rank, RolloutWorker.rollout, part, samples) for rank, part in enumerate(parts)]
    return [t for call in calls for t in call.wait(timeout=300)]


def test_a_scripted_trajectory_finds_its_own_turns_only_on_its_own_engine(two_slot_cluster, hotpot_server,
                                                                          tiny_model_dir):
    """A scripted engine replays turn n of a trajectory only to the engine that saw its turn 1 (another engine
    would take the continuation for a new prompt and search again): every trajectory searching once and then
    answering shows its turns stayed on one engine, through real Ray handles."""
    rollout = RolloutConfig(backend="tests.test_search_group:scripted_search_engine", model_path=str(tiny_model_dir))
    search = SearchToolConfig(server_addr=hotpot_server.address, topk=1)
    engines, loops = _launch(two_slot_cluster, rollout, AgentLoopConfig(max_turns=2, max_tokens_per_turn=16), search)
    try:
        records = _records(8)
        trajectories = _rollout(loops, [records[:5], records[5:]], samples=1)  # uneven shares
        assert [(t.uid, t.num_searches, t.finish_reason) for t in trajectories] == [
            (r.uid, 1, "answer") for r in records]
        served = [s["served"] for s in engines.call(EngineServerWorker.stats).wait(timeout=60)]
        assert sum(served) == 16 and min(served) > 0, served  # two turns each, both engines used
        routed = loops.call(AgentLoopWorker.routed).wait(timeout=60)
        assert [sum(r) for r in routed] == [5, 3], "each trajectory was routed once, its second turn followed it"
    finally:
        loops.shutdown()
        engines.shutdown()


@pytest.mark.heavy  # a minute: two groups of the tiny model on 2 cores
def test_engine_servers_sample_what_inline_rollout_ranks_sample(two_slot_cluster, hotpot_server, tiny_model_dir):
    """The tiny Qwen2 through the hf engine: agent-loop ranks sending turns to engine servers give the very
    trajectories inline rollout ranks give (same shares, same per-request seeds), and weights reach the servers."""
    rollout = RolloutConfig(backend="hf", model_path=str(tiny_model_dir))
    loop = AgentLoopConfig(max_turns=2, max_tokens_per_turn=12)
    search = SearchToolConfig(server_addr=hotpot_server.address, topk=1)
    records = _records(3)
    parts = [records[:2], records[2:]]
    inline = RolloutWorker.create_group(rollout, loop, search, 0).launch(
        two_slot_cluster, two_slot_cluster.placement["rollout"], name="InlineRollout")
    try:
        expected = _rollout(inline, parts, samples=2)
    finally:
        inline.shutdown()
    engines, loops = _launch(two_slot_cluster, rollout, loop, search)
    try:
        got = _rollout(loops, parts, samples=2)
        assert [t.response_ids for t in got] == [t.response_ids for t in expected]
        flat = [x for t in got for x in t.rollout_logprobs]
        assert flat == pytest.approx([x for t in expected for x in t.rollout_logprobs], abs=1e-4)
        assert sum(t.num_turns for t in got) > len(got), "multi-turn trajectories (corrections after cut turns)"
        assert sum(t.num_turns for t in got) == sum(s["served"] for s in engines.call(EngineServerWorker.stats).wait())
        # Weights go to the servers (the agent-loop ranks hold none and say so).
        state = _weights(tiny_model_dir)
        engines.call(EngineServerWorker.set_weights, state, 7).wait(timeout=60)
        assert [s["weight_version"] for s in engines.call(EngineServerWorker.stats).wait()] == [7, 7]
        with pytest.raises(Exception, match="sync them to the engine servers"):
            loops.call_on(0, RolloutWorker.set_weights, state, 7).wait(timeout=60)
    finally:
        loops.shutdown()
        engines.shutdown()


def _weights(model_dir) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}

"""The SearchTool group: one search client for the whole two_slot_cluster, called by agent loops in other processes
through a real Ray cluster and a real retrieval server."""

from __future__ import annotations

import asyncio
import socket

import pytest
import ray

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.data.io_struct import QARecord
from rlinf_search.scheduler import Worker
from rlinf_search.tools.search import SearchToolConfig
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from rlinf_search.scheduler.placement import host_placement
from rlinf_search.workers.tool.remote import GroupSearchTool, tool_rank
from rlinf_search.workers.tool.worker import SearchToolWorker, rank_share

QUERIES = ["Lilu demon", "Demon Dice", "Vancouver International Airport", "Formula One Arcade", "Navarretia cotulifolia",
           "Tere Naam", "Chicago Tigers", "Trevor LeBlanc"]  # titles of the bundled HotpotQA corpus


class SearchCaller(Worker):
    """A rank of some other group (a rollout rank, in a run) that searches through the SearchTool group."""

    def search_all(self, actors: list, queries: list[str]) -> list[dict]:
        async def run():
            tool = GroupSearchTool(actors)
            return await asyncio.gather(*(tool.search(q) for q in queries))

        return [{"query": o.query, "hits": len(o.hits), "error": o.error} for o in asyncio.run(run())]

    def scripted_rollout(self, actors: list, model_dir: str, question: str, query: str) -> dict:
        """One Search-R1 trajectory, scripted turns, through the real agent loop and the group's search."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        turns = [f"<search> {query} </search>", "<answer> a spirit </answer>"]
        loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, turns), GroupSearchTool(actors), tokenizer,
                                 AgentLoopConfig(max_turns=2, max_tokens_per_turn=16))
        record = QARecord(uid="q-1", prompt=[{"role": "user", "content": question}], golden_answers=["a spirit"],
                          data_source="hotpotqa", question=question)
        traj = asyncio.run(loop.run(record))
        return {"searches": traj.num_searches, "search_errors": traj.search_errors, "text": traj.response_text,
                "finish": traj.finish_reason, "infra_error": traj.infra_error}


def test_a_query_always_goes_to_the_same_rank():
    assert tool_rank("Lilu  demon ", 3) == tool_rank("Lilu demon", 3)
    assert len({tool_rank(q, 2) for q in QUERIES}) == 2  # both ranks get work
    assert all(tool_rank(q, 1) == 0 for q in QUERIES)


def test_ranks_share_the_limits():
    config = SearchToolConfig(max_concurrency=64, rate_limit_per_s=10.0, cache_size=1001, num_workers=4)
    share = rank_share(config, 4)
    assert (share.max_concurrency, share.rate_limit_per_s, share.cache_size) == (16, 2.5, 251)
    assert rank_share(SearchToolConfig(max_concurrency=2), 4).max_concurrency == 1
    assert rank_share(config, 1) is config
    with pytest.raises(ValueError, match="num_workers"):
        SearchToolConfig(num_workers=-1)


def test_two_callers_share_one_cache_and_the_agent_loop_searches_through_it(two_slot_cluster, hotpot_server,
                                                                            tiny_model_dir):
    config = SearchToolConfig(server_addr=hotpot_server.address, topk=2, num_workers=2)
    tools = SearchToolWorker.create_group(config).launch(two_slot_cluster, host_placement("SearchToolGroup", 2),
                                                         name="SearchToolGroup")
    callers = SearchCaller.create_group().launch(two_slot_cluster, two_slot_cluster.placement["rollout"],
                                                 name="callers")
    try:
        actors = list(tools.actors)
        # Both caller processes search the same queries at once: each query is sent to the server once.
        results = callers.call(SearchCaller.search_all, actors, QUERIES).wait(timeout=120)
        for per_rank in results:
            assert [r["error"] for r in per_rank] == [None] * len(QUERIES)
            assert all(r["hits"] >= 1 for r in per_rank), per_rank  # BM25: only passages sharing a term
        stats = tools.call(SearchToolWorker.stats).wait(timeout=60)
        assert sum(s["calls"] for s in stats) == 2 * len(QUERIES)
        assert sum(s["cache_hits"] + s["shared"] for s in stats) == len(QUERIES)
        assert all(s["calls"] > 0 for s in stats)  # the queries were dealt to both ranks
        # A third caller, later: all from the cache, nothing sent.
        sent = sum(s["requests"] for s in stats)
        again = callers.call_on(0, SearchCaller.search_all, actors, QUERIES).wait(timeout=60)
        assert [r["error"] for r in again] == [None] * len(QUERIES)
        assert sum(s["requests"] for s in tools.call(SearchToolWorker.stats).wait(timeout=60)) == sent

        traj = callers.call_on(1, SearchCaller.scripted_rollout, actors, str(tiny_model_dir),
                               "What is Lilu?", "Lilu demon").wait(timeout=120)
        assert (traj["searches"], traj["search_errors"], traj["finish"]) == (1, 0, "answer")
        assert "<information>" in traj["text"] and "Lilu" in traj["text"]

        # A tool rank killed: its queries come back as error outcomes, never exceptions; the trajectory ends there,
        # marked as an infrastructure failure (the step re-runs or drops its group, never trains it).
        dead = tool_rank("Lilu demon", 2)
        ray.kill(actors[dead], no_restart=True)
        traj = callers.call_on(0, SearchCaller.scripted_rollout, actors, str(tiny_model_dir),
                               "What is Lilu?", "Lilu demon").wait(timeout=120)
        assert (traj["searches"], traj["search_errors"], traj["finish"]) == (1, 1, "infra_error")
        assert traj["infra_error"].startswith(f"search tool rank {dead} failed: ")
        alive = [q for q in QUERIES if tool_rank(q, 2) != dead]
        answers = callers.call_on(0, SearchCaller.search_all, actors, [*alive, "Lilu demon"]).wait(timeout=60)
        assert [a["error"] for a in answers[:-1]] == [None] * len(alive)
        assert answers[-1]["error"].startswith(f"search tool rank {dead} failed: ")
        assert "\n" not in answers[-1]["error"]
    finally:
        callers.shutdown()
        tools.shutdown()


def scripted_search_engine(config, *, device=None, seed=0):
    """``rollout.rollout_backend: tests.test_search_group:scripted_search_engine``: every trajectory searches
    the same query, then answers (a random tiny model seldom writes a search)."""
    from transformers import AutoTokenizer

    return ScriptedEngine(AutoTokenizer.from_pretrained(config.model_path),
                          ["<search> Lilu demon </search>", "<answer> a spirit </answer>"])


def test_a_run_searches_through_the_group(two_slot_cluster, hotpot_server, tiny_model_dir):
    """The path a run takes: ``launch_search_group`` hands the group to real rollout ranks, whose agent loops
    (one process each) then search through it: 4 trajectories on 2 ranks, one request answered by the server.
    The group's client is the replicated one: a second replica that is down costs no query, and the step's
    metrics count it per replica."""
    from rlinf_search.workers.rollout.config import RolloutConfig
    from rlinf_search.workers.rollout.worker import RolloutWorker
    from rlinf_search.workers.tool.launch import SearchGroupMeter, launch_search_group

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there once closed
    search = SearchToolConfig(server_addr=[hotpot_server.address, down], topk=1, num_workers=1)
    engine = RolloutConfig(backend="tests.test_search_group:scripted_search_engine", model_path=str(tiny_model_dir))
    rollout = RolloutWorker.create_group(engine, AgentLoopConfig(max_turns=2, max_tokens_per_turn=16), search,
                                         0).launch(two_slot_cluster, two_slot_cluster.placement["rollout"],
                                                   name="RolloutGroup")
    try:
        unused = SearchToolConfig(server_addr=hotpot_server.address)  # num_workers 0: no group
        assert launch_search_group(unused, two_slot_cluster, rollout) is None
        tools = launch_search_group(search, two_slot_cluster, rollout)
        assert tools is not None and tools.world_size == 1
        records = [QARecord(uid=f"q-{i}", prompt=[{"role": "user", "content": f"Question {i} about Lilu?"}],
                            golden_answers=["a spirit"], data_source="hotpotqa", question=f"Question {i}")
                   for i in range(4)]
        parts = [records[:2], records[2:]]
        trajectories = [t for part in [rollout.call_on(rank, RolloutWorker.rollout, part, 1).wait(timeout=120)
                                       for rank, part in enumerate(parts)] for t in part]
        assert [(t.num_searches, t.search_errors) for t in trajectories] == [(1, 0)] * 4
        assert all("Lilu" in t.response_text for t in trajectories)
        [stats] = tools.call(SearchToolWorker.stats).wait(timeout=60)
        assert (stats["calls"], stats["cache_hits"] + stats["shared"], stats["requests"]) == (4, 3, 1)
        metrics = SearchGroupMeter(tools).step()
        assert metrics["runtime/tool_restarts"] == 0
        assert metrics[f"search/replica/{hotpot_server.address}/requests"] == 1
        assert metrics[f"search/replica/{hotpot_server.address}/admitted"] == 1
        # Idle replicas take turns, so the first request tried the one that is down, then moved on.
        assert metrics[f"search/replica/{down}/failures"] == metrics[f"search/replica/{down}/requests"] == 1
        tools.shutdown()
    finally:
        rollout.shutdown()

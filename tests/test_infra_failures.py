"""An infrastructure failure is never the model's: a real retrieval server killed under the agent loop marks the
trajectories it failed, their group is rolled out again once the server is back, and a query the server refuses
stays the model's. The step-level part (a group still failing is dropped, too many stop the run) is in
``tests/test_infra_run.py``."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from transformers import AutoTokenizer

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.data.io_struct import FinishedGroup, QARecord, Trajectory
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.runners.infra_failures import InfraFailureTally, RunStopped
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR

TURNS = ["<search> first query </search>", "<search> second query </search>", "<answer> done </answer>"]
FAST_RETRIES = dict(backoff_base_s=0.05, backoff_max_s=0.2, deadline_s=10.0, timeout_s=5.0)


class ReplayedScript(ScriptedEngine):
    """The scripted turns, replayed from the first whenever a trajectory starts again from its bare prompt (a
    group's re-run): the model writes the same searches the second time."""

    def _turn_index(self, prompt_ids: list[int]) -> int:
        key = tuple(prompt_ids)
        if key in self._first_prompt:
            self._next_turn[key] = 1
            return 0
        return super()._turn_index(prompt_ids)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def server_args(hotpot_index_dir, hotpot_corpus):
    return ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25"]


def _records(n: int) -> list[QARecord]:
    rows = [json.loads(line) for line in (HOTPOT_DIR / "test.jsonl").read_text().splitlines()[:n]]
    return [QARecord(uid=f"hotpot-{r['id']}", prompt=[{"role": "user", "content": r["question"]}],
                     golden_answers=r["golden_answers"], data_source="hotpotqa", question=r["question"])
            for r in rows]


async def _kill_after_first_searches(server, tool, rollouts: asyncio.Future, count: int):
    while tool.metrics.snapshot()["calls"] < count:  # every first search has been answered
        await asyncio.sleep(0.01)
    server.kill()
    return await rollouts


def test_a_server_killed_mid_batch_ends_each_rollout_as_an_infrastructure_failure(tokenizer, server_args):
    records = _records(12)
    with RetrievalServerProcess(server_args) as server:
        tool = build_search_tool(SearchToolConfig(server_addr=server.address, **FAST_RETRIES))
        loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, TURNS, delay_s=0.3), tool, tokenizer,
                                 AgentLoopConfig(max_turns=2, infra_reruns=0))

        async def run():
            return await _kill_after_first_searches(server, tool, asyncio.ensure_future(loop.run_batch(records)),
                                                    len(records))

        trajs = asyncio.run(run())
    assert len(trajs) == 12
    for traj in trajs:
        # The first search was answered; the second met the dead server, and the rollout ended there: no third
        # generation, and the failure is named (the server's address, what happened) for the step to drop it.
        assert traj.finish_reason == "infra_error" and traj.num_turns == 2 and traj.num_searches == 2
        assert traj.search_errors == 1 and traj.infra_reruns == 0
        assert server.address in traj.infra_error and "unreachable" in traj.infra_error, traj.infra_error
    groups = [FinishedGroup(index=i, rank=0, trajectories=[t]) for i, t in enumerate(trajs)]
    assert all(g.infra_error for g in groups)


def test_a_group_is_rolled_out_again_once_the_server_is_back(tokenizer, server_args):
    """The server dies after the first searches and comes back on its port about a second later: every group is
    rolled out again (same searches) after the wait, and what is kept has no error in it."""
    records = _records(6)
    with RetrievalServerProcess(server_args) as server:
        port = server.address.rpartition(":")[2]
        tool = build_search_tool(SearchToolConfig(server_addr=server.address, **FAST_RETRIES))
        engine = ReplayedScript(tokenizer, TURNS, delay_s=0.2)
        config = AgentLoopConfig(max_turns=2, infra_reruns=3, infra_rerun_wait_s=2.0)
        loop = SearchR1AgentLoop(engine, tool, tokenizer, config)
        restarted: list[RetrievalServerProcess] = []

        def restart_later():
            time.sleep(1.0)
            restarted.append(RetrievalServerProcess([*server_args, "--port", port]).start())

        async def run():
            rollouts = asyncio.ensure_future(loop.run_batch(records))
            while tool.metrics.snapshot()["calls"] < len(records):
                await asyncio.sleep(0.01)
            server.kill()
            threading.Thread(target=restart_later, daemon=True).start()
            return await rollouts

        started = time.monotonic()
        try:
            trajs = asyncio.run(run())
        finally:
            for back in restarted:
                back.stop()
        took = time.monotonic() - started
    assert restarted, "the server came back"
    for traj in trajs:
        assert traj.finish_reason == "answer" and traj.infra_error is None and traj.search_errors == 0
        assert traj.num_searches == 2 and "Search failed" not in traj.response_text
        assert 1 <= traj.infra_reruns <= 3
    # Re-runs waited (2 s, then 4 s, ...) rather than spinning on the dead server.
    assert took >= 2.0


def test_a_query_the_server_refuses_stays_the_models(tokenizer, server_args):
    """HTTP 413 for a query over the server's 4,096 characters: the model wrote it, so the trajectory goes on and
    is trained as before (no infrastructure mark, no re-run)."""
    long_query = "<search> " + "lilu " * 1000 + "</search>"
    with RetrievalServerProcess(server_args) as server:
        tool = build_search_tool(SearchToolConfig(server_addr=server.address, **FAST_RETRIES))
        loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, [long_query, "<answer> x </answer>"]), tool, tokenizer,
                                 AgentLoopConfig(max_turns=2, max_tokens_per_turn=4000, max_response_tokens=8000,
                                                 infra_rerun_wait_s=30.0))
        started = time.monotonic()
        [traj] = asyncio.run(loop.run_batch(_records(1)))
    assert time.monotonic() - started < 20, "no re-run wait"
    assert traj.search_errors == 1 and "HTTP 413" in traj.response_text
    assert traj.infra_error is None and traj.infra_reruns == 0 and traj.finish_reason == "answer"


def _group(index: int, *, error: str | None = None, reruns: int = 0) -> FinishedGroup:
    trajs = [Trajectory(uid=f"u{index}", prompt_ids=[1], response_ids=[2], response_mask=[1], rollout_logprobs=[0.0],
                        infra_error=error, infra_reruns=reruns) for _ in range(2)]
    return FinishedGroup(index=index, rank=0, trajectories=trajs)


def test_the_tally_drops_failed_groups_and_stops_past_the_share():
    tally = InfraFailureTally(3, 8, max_share=0.25)
    kept = tally.keep([_group(0), _group(1, reruns=1), _group(2, error="search backend at h:1 unreachable",
                                                                 reruns=2)])
    assert [g.index for g in kept] == [0, 1]
    kept = tally.keep([_group(3, error="search backend at h:1 unreachable", reruns=2), _group(4)])
    assert [g.index for g in kept] == [4]
    assert tally.metrics() == {"rollout/groups_rerun_infra": 3.0, "rollout/groups_dropped_infra": 2.0}
    assert tally.dropped_uids == ["u2", "u3"]
    with pytest.raises(RunStopped, match=r"step 3: 3 of 8 GRPO groups met an infrastructure failure after 2 re-runs "
                                         r"each, more than runner.max_infra_failed_share \(0.25\); first: search "
                                         r"backend at h:1 unreachable"):
        tally.keep([_group(5, error="search backend at h:1 unreachable", reruns=2)])
    # A step whose every group failed stops whatever the share.
    with pytest.raises(RunStopped):
        InfraFailureTally(1, 1, max_share=1.0).keep([_group(0, error="x")])

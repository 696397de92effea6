"""The Search-R1 agent loop: exact masks against a scripted engine, limits, drift, and real HTTP search."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from transformers import AutoTokenizer

from rlinf_search.config.model import AgentLoopSection
from rlinf_search.section_model import parse_section
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.agents.searchr1.protocol import INVALID_ACTION_OBSERVATION, parse_action
from rlinf_search.data.io_struct import QARecord, SamplingParams
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def inprocess_tool_config(hotpot_index_dir, hotpot_corpus):
    return SearchToolConfig(backend="inprocess", index_dir=str(hotpot_index_dir), corpus=str(hotpot_corpus),
                            retriever="bm25")


def _records(n: int) -> list[QARecord]:
    rows = [json.loads(line) for line in (HOTPOT_DIR / "test.jsonl").read_text().splitlines()[:n]]
    return [QARecord(uid=f"hotpot-{r['id']}", prompt=[{"role": "user", "content": r["question"]}],
                     golden_answers=r["golden_answers"], data_source="hotpotqa", question=r["question"])
            for r in rows]


def _segments(traj):
    """Split the response into runs of equal mask: [(mask, ids), ...]."""
    runs = []
    for token, mask in zip(traj.response_ids, traj.response_mask):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token)
        else:
            runs.append((mask, [token]))
    return runs


def test_parse_action():
    assert parse_action("<think>x</think> <search> Lilu demon </search>").content == "Lilu demon"
    assert parse_action("<answer> a spirit </answer>").kind == "answer"
    assert parse_action("<search>   </search>").kind == "invalid"
    assert parse_action("I think <search> unclosed").kind == "invalid"
    assert parse_action("<answer></answer>") .kind == "answer"


def test_masks_line_up_with_observations_exactly(tokenizer, inprocess_tool_config):
    turns = ["<think> I need the demon </think> <search> Lilu demon </search>",
             "<think> found it </think> <answer> a spirit </answer>"]
    engine = ScriptedEngine(tokenizer, turns)
    tool = build_search_tool(inprocess_tool_config)
    loop = SearchR1AgentLoop(engine, tool, tokenizer, AgentLoopConfig(max_turns=2))
    traj = asyncio.run(loop.run(_records(1)[0]))

    runs = _segments(traj)
    assert [mask for mask, _ in runs] == [1, 0, 1]
    assert tokenizer.decode(runs[0][1]) == turns[0]
    assert tokenizer.decode(runs[2][1]) == turns[1]
    observation = tokenizer.decode(runs[1][1])
    assert observation.startswith("\n\n<information>Doc 1(Title: ") and observation.endswith("</information>\n\n")
    assert "Lilu" in observation
    assert traj.response_text == turns[0] + observation + turns[1]
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.rollout_logprobs)
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, traj.response_mask) if m == 0)
    assert all(lp == -0.5 for lp, m in zip(traj.rollout_logprobs, traj.response_mask) if m == 1)
    assert (traj.num_searches, traj.queries, traj.finish_reason, traj.num_turns) == (1, ["Lilu demon"], "answer", 2)
    assert traj.prompt_ids == loop.prompt_ids(_records(1)[0]) and not traj.drifted
    # The second turn continued the whole context: prompt, turn 1 and the observation.
    assert engine.calls[1][0] == traj.prompt_ids + traj.response_ids[: len(runs[0][1]) + len(runs[1][1])]


def test_turn_limit_then_one_generation_without_search(tokenizer, inprocess_tool_config):
    turns = ["<search> one </search>", "no action here", "<search> three </search>", "<search> four </search>"]
    engine = ScriptedEngine(tokenizer, turns)
    loop = SearchR1AgentLoop(engine, build_search_tool(inprocess_tool_config), tokenizer,
                             AgentLoopConfig(max_turns=2))
    traj = asyncio.run(loop.run(_records(1)[0]))
    stops = [sampling.stop for _, sampling in engine.calls]
    assert stops == [("</search>", "</answer>")] * 3, "the last turn stops at </search> too"
    assert traj.num_searches == 1 and traj.finish_reason == "max_turns" and traj.num_turns == 3
    assert INVALID_ACTION_OBSERVATION in traj.response_text, "a turn without an action gets the correction"
    assert [span.kind for span in traj.spans] == ["model", "information", "model", "correction", "model"]


def test_observation_and_response_limits(tokenizer, inprocess_tool_config):
    turns = ["<search> Lilu demon spirit Akkadian </search>", "<answer> x </answer>"]
    config = AgentLoopConfig(max_turns=2, max_obs_tokens=40, max_passage_tokens=500)
    traj = asyncio.run(SearchR1AgentLoop(ScriptedEngine(tokenizer, turns), build_search_tool(inprocess_tool_config),
                                         tokenizer, config).run(_records(1)[0]))
    observation_ids = _segments(traj)[1][1]
    assert len(observation_ids) == 40
    assert tokenizer.decode(observation_ids).endswith("</information>\n\n"), "the cut keeps the closing tag"

    long_turns = ["<search> q </search>", "word " * 300, "<answer> y </answer>"]
    capped = AgentLoopConfig(max_turns=3, max_response_tokens=120, max_tokens_per_turn=50)
    traj = asyncio.run(SearchR1AgentLoop(ScriptedEngine(tokenizer, long_turns), build_search_tool(inprocess_tool_config),
                                         tokenizer, capped).run(_records(1)[0]))
    assert len(traj.response_ids) <= 120 and traj.finish_reason == "max_response_tokens"
    with pytest.raises(ValueError, match="agentloop.max_tool_response_length must be >= 1"):
        parse_section(AgentLoopSection, {"max_tool_response_length": 0}, path="agentloop")


def test_hf_engine_against_real_server_and_drift(tiny_model_dir, tokenizer, hotpot_index_dir, hotpot_corpus):
    """The random tiny model samples freely: invariants must hold for whatever it writes."""
    engine = HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=3))
    config = AgentLoopConfig(max_turns=2, max_tokens_per_turn=48, max_response_tokens=256, max_obs_tokens=120,
                             sampling=SamplingParams(temperature=1.0))
    server_args = ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25"]
    with RetrievalServerProcess(server_args) as server:
        tool = build_search_tool(SearchToolConfig(server_addr=server.address))
        loop = SearchR1AgentLoop(engine, tool, tokenizer, config)
        trajs = asyncio.run(loop.run_batch(_records(8), samples_per_prompt=2))
        retok = SearchR1AgentLoop(engine, tool, tokenizer, AgentLoopConfig(**{**config.__dict__, "retokenize": True}))
        retok_trajs = asyncio.run(retok.run_batch(_records(4), samples_per_prompt=2))
    assert len(trajs) == 16 and [t.uid for t in trajs[:2]] == [trajs[0].uid] * 2
    for traj in trajs:
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.rollout_logprobs) <= 256
        assert traj.response_text == tokenizer.decode(traj.response_ids)
        assert traj.num_turns <= 3 and traj.num_searches <= 2
        assert all(not math.isnan(lp) for lp in traj.rollout_logprobs)
        for mask, ids in _segments(traj):
            if mask == 0:
                text = tokenizer.decode(ids)
                assert text.startswith("\n\n<information>") or text == INVALID_ACTION_OBSERVATION
    # A random model's sampled ids are often not what re-encoding its text gives: the drift is measured.
    assert sum(t.drifted for t in trajs) > 0
    for traj in retok_trajs:
        model_logprobs = [lp for lp, m in zip(traj.rollout_logprobs, traj.response_mask) if m == 1]
        assert model_logprobs and all(math.isnan(lp) for lp in model_logprobs)


@pytest.mark.parametrize("seeded", [True, False])
def test_rollout_seeded_decides_who_seeds_each_request(seeded, tiny_model_dir, inprocess_tool_config, monkeypatch):
    """``rollout.seeded`` through the rollout worker and a real HF engine: true gives every request a seed of
    its own (distinct per trajectory and turn); false sends none, and the engine's shared generator samples."""
    from rlinf_search.workers.rollout.config import RolloutConfig
    from rlinf_search.workers.rollout.worker import RolloutWorker

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "RLINF_GROUP_NAME": "RolloutGroup",
                        "RLINF_CPU_SLOT": "0"}.items():
        monkeypatch.setenv(name, value)  # what the worker group sets on a rank
    rollout = RolloutConfig(backend="tests.registry_plugins:recording_hf_engine", model_path=str(tiny_model_dir),
                            seeded=seeded)
    worker = RolloutWorker(rollout, AgentLoopConfig(max_turns=1, max_tokens_per_turn=8), inprocess_tool_config,
                           seed=5)
    state = worker.rng_state()
    trajectories = worker.rollout(_records(2), 2)
    assert len(trajectories) == 4 and worker.rng_state() != state, "a seed is drawn per call either way"
    seeds = [request.seed for request in worker.engine.requests]
    assert len(seeds) >= 4
    if seeded:
        assert None not in seeds and len(set(seeds)) == len(seeds)
    else:
        assert set(seeds) == {None}

"""Registry entries with keys of their own: an advantage estimator, a reward score and an agent protocol of a user's
(named by dotted path), and the HF engine. Start-up validates ``algorithm.adv_settings``, ``reward.score_settings``,
``agent.protocol_settings`` and ``rollout.engine_settings`` with the models they declare (one line per error), and
the run's advantage stage, RewardWorker, agent loop and engine factory hand the validated settings over. The
trajectories come from the Search-R1 loop over a real BM25 index; the batch is collated as the trainer collates it.
(The loss's and a tool's settings: ``test_loss_plugin.py``, ``test_tool_plugin.py``.)"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from omegaconf import OmegaConf
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.algorithms import ADVANTAGE_ESTIMATORS, AdvantageOutput, advantage_traits
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.batch import collate_trajectories
from rlinf_search.data.io_struct import QARecord
from rlinf_search.plugin_settings import with_settings
from rlinf_search.retrieval.build_index import main as build_index_main
from rlinf_search.rewards.scores import em_reward
from rlinf_search.runners.stages.passes import AdvantageStage
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR

HERE = "tests.test_plugin_settings"


class CappedSettings(BaseModel):
    """``algorithm.adv_settings`` of ``capped_grpo``."""

    cap: float = Field(1.0, gt=0)
    """The largest advantage magnitude kept."""


@with_settings(CappedSettings)
@advantage_traits(group_local=True, needs_group=True)
def capped_grpo(inputs) -> AdvantageOutput:
    """GRPO's advantages cut to [-cap, cap]."""
    out = ADVANTAGE_ESTIMATORS.resolve("grpo")(inputs)
    capped = out.advantages.clamp(-inputs.settings.cap, inputs.settings.cap)
    return AdvantageOutput(advantages=capped, returns=capped)


class CreditSettings(BaseModel):
    """``reward.score_settings`` of ``em_with_credit``."""

    wrong_answer_credit: float = Field(0.0, ge=0, le=1)
    """What an answer that is given but wrong earns."""


@with_settings(CreditSettings)
def em_with_credit(solution_str, golden_answers, *, settings: CreditSettings, **_) -> float:
    """Exact match, and ``wrong_answer_credit`` for a wrong answer in its tags."""
    if em_reward(solution_str, golden_answers):
        return 1.0
    return settings.wrong_answer_credit if "<answer>" in solution_str else 0.0


def _config(tmp_path, **changes):
    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    OmegaConf.update(cfg, "runner.output_dir", str(tmp_path))
    cfg.data.train_data_paths, cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")], []
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@pytest.mark.parametrize("changes, message", [
    ({"algorithm.adv_type": f"{HERE}:capped_grpo", "algorithm.adv_settings": {"cap": 0}},
     "algorithm.adv_settings.cap must be > 0, got 0"),
    ({"algorithm.adv_type": f"{HERE}:capped_grpo", "algorithm.adv_settings": {"clip": 1}},
     f"algorithm.adv_settings.clip: unknown key; adv_type {HERE}:capped_grpo takes cap"),
    ({"algorithm.adv_settings": {"cap": 1}},
     "algorithm.adv_settings: adv_type grpo takes no settings (it declares no settings model); remove "
     "algorithm.adv_settings"),
    ({"reward.score": f"{HERE}:em_with_credit", "reward.score_settings": {"wrong_answer_credit": 2}},
     "reward.score_settings.wrong_answer_credit must be in [0, 1], got 2"),
    ({"reward.score": f"{HERE}:em_with_credit", "reward.score_settings": {"wrong_answer": 0.1}},
     f"reward.score_settings.wrong_answer: unknown key; score {HERE}:em_with_credit takes wrong_answer_credit; did "
     "you mean wrong_answer_credit?"),
    ({"reward.score_settings": {"wrong_answer_credit": 0.1}},
     "reward.score_settings: score em takes no settings (it declares no settings model); remove "
     "reward.score_settings"),
    ({"rollout.engine_settings": {"admit_every_steps": 0}},
     "rollout.engine_settings.admit_every_steps must be >= 1, got 0"),
    ({"rollout.engine_settings": {"prefix_cache": 0}},
     "rollout.engine_settings.prefix_cache: unknown key; rollout_backend hf takes admit_every_steps, "
     "lean_decode, prefix_cache_tokens, shared_prefix_tokens; did you mean prefix_cache_tokens?"),
    ({"rollout.rollout_backend": "examples.plugins.gpu_offload_engine:build", "cluster.component_placement":
      {"actor": "0", "rollout": "1", "reward": "0"}, "rollout.engine_settings": {"admit_every_steps": 2}},
     "rollout.engine_settings: rollout_backend examples.plugins.gpu_offload_engine:build takes no settings (it "
     "declares no settings model); remove rollout.engine_settings")])
def test_each_plugins_own_keys_are_validated_at_start_up_in_one_line(tmp_path, changes, message):
    with pytest.raises(ConfigError) as caught:
        validate_cfg(_config(tmp_path, **changes))
    assert str(caught.value) == message


@pytest.fixture(scope="module")
def search_config(tmp_path_factory):
    root = tmp_path_factory.mktemp("paris")
    corpus = root / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    assert build_index_main(["--corpus", str(corpus), "--out", str(root / "index"), "--retriever", "bm25"]) == 0
    return SearchToolConfig(backend="inprocess", index_dir=str(root / "index"), corpus=str(corpus), retriever="bm25")


def test_the_runs_reward_worker_and_advantage_stage_hand_each_plugin_its_settings(tmp_path, tiny_model_dir,
                                                                                  search_config):
    run = validate_cfg(_config(tmp_path, **{
        "algorithm.adv_type": f"{HERE}:capped_grpo", "algorithm.adv_settings": {"cap": 0.5},
        "reward.score": f"{HERE}:em_with_credit", "reward.score_settings": {"wrong_answer_credit": 0.25}}))
    # (the dotted path imports this file as a module of its own, so compare values, not classes)
    assert run.adv_settings.model_dump() == {"cap": 0.5}
    assert run.reward.score_settings.model_dump() == {"wrong_answer_credit": 0.25}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    record = QARecord(uid="france", prompt="Question: What is the capital of France?\n", golden_answers=["Paris"],
                      data_source="t", question="What is the capital of France?")
    # the fifth turn is the fourth trajectory's second, after the loop's correction
    turns = ["<answer> Paris </answer>", "<answer> Lyon </answer>", "<answer> Paris </answer>", "I do not know.",
             "Still no idea."]
    loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, turns), build_search_tool(search_config), tokenizer,
                             AgentLoopConfig(max_turns=1))
    trajs = asyncio.run(loop.run_batch([record], 4))
    scores = RewardWorker(run.reward).score(trajs)
    assert [s.reward for s in scores] == [1.0, 0.25, 1.0, 0.0], "the wrong answer earns the configured credit"
    assert [s.em for s in scores] == [1.0, 0.0, 1.0, 0.0]
    batch = collate_trajectories(trajs, [s.reward for s in scores], tokenizer.pad_token_id)
    AdvantageStage.build(run)(batch)
    per_row = (batch.advantages * batch.response_mask).sum(-1) / batch.response_mask.sum(-1)
    # GRPO of (1, 0.25, 1, 0) is (0.83, -0.60, 0.83, -1.06): both signs cut at 0.5
    assert torch.allclose(per_row, torch.tensor([0.5, -0.5, 0.5, -0.5]))


def test_the_hf_engine_is_built_with_its_settings_and_generates_with_them(tmp_path, tiny_model_dir):
    """prefix_cache_tokens 0: a trajectory's second turn prefills its whole context again, where the default
    reuses the first turn's states."""
    from rlinf_search.data.io_struct import SamplingParams
    from rlinf_search.workers.rollout.base import build_engine

    reused = {}
    for settings in ({"admit_every_steps": 2, "prefix_cache_tokens": 0, "lean_decode": False}, None):
        run = validate_cfg(_config(tmp_path, **{"rollout.model.model_path": str(tiny_model_dir),
                                                "rollout.engine_settings": settings}))
        engine = build_engine(run.rollout, device="cpu")
        expected = settings or {"admit_every_steps": 8, "prefix_cache_tokens": 65536, "lean_decode": True}
        assert (engine.config.admit_every_steps, engine.config.prefix_cache_tokens,
                engine.config.lean_decode) == tuple(expected.values())
        assert (engine.lean is not None) == expected["lean_decode"]

        async def two_turns():
            # every letter and digit stops: the first turn ends at a stop string, which is what leaves states
            sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3,
                                      stop=tuple("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
            first = await engine.generate([5, 6, 7, 8, 9, 10], sampling)
            await engine.generate([5, 6, 7, 8, 9, 10, *first.output_ids, 11, 12], sampling)
            await engine.aclose()
            return first

        first = asyncio.run(two_turns())
        reused[settings is None] = (first.finish_reason, engine.stats.reused_tokens)
    assert reused[True][0] == reused[False][0] == "stop"
    assert reused[False][1] == 0 and reused[True][1] > 0


class CorrectionSettings(BaseModel):
    """``agent.protocol_settings`` of ``CustomCorrectionLoop``."""

    correction: str = Field("\nWrite <search> query </search> or <answer> answer </answer>.\n", min_length=1)
    """What the model reads after a turn with neither tag."""


@with_settings(CorrectionSettings)
class CustomCorrectionLoop(SearchR1AgentLoop):
    """Search-R1's protocol with a correction of the run's choosing."""

    async def observe_step(self, rollout) -> None:
        if rollout.action.kind == "search":
            await super().observe_step(rollout)
            return
        rollout.tool_turns += 1
        self.append_observation(rollout.traj, self._encode(self.config.protocol_settings.correction),
                                kind="correction")


def test_a_protocols_own_keys_reach_the_loop_the_validated_config_builds(tmp_path, tiny_model_dir, search_config):
    from rlinf_search.agents import build_agent_loop

    with pytest.raises(ConfigError) as caught:
        validate_cfg(_config(tmp_path, **{"agent.protocol": f"{HERE}:CustomCorrectionLoop",
                                          "agent.protocol_settings": {"correction": ""}}))
    assert str(caught.value) == ("agent.protocol_settings.correction: String should have at least 1 character, "
                                 "got ''")
    with pytest.raises(ConfigError, match="^agent.protocol_settings: protocol searchr1 takes no settings"):
        validate_cfg(_config(tmp_path, **{"agent.protocol_settings": {"correction": "x"}}))
    run = validate_cfg(_config(tmp_path, **{"agent.protocol": f"{HERE}:CustomCorrectionLoop",
                                            "agent.protocol_settings": {"correction": "\nUse the tags, please.\n"}}))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    record = QARecord(uid="france", prompt="Question: What is the capital of France?\n", golden_answers=["Paris"],
                      data_source="t", question="What is the capital of France?")
    loop = build_agent_loop(ScriptedEngine(tokenizer, ["Hmm.", "<answer> Paris </answer>"]),
                            build_search_tool(search_config), tokenizer, run.agent_loop)
    traj = asyncio.run(loop.run(record))
    (correction,) = (span.text for span in traj.spans if span.kind == "correction")
    assert correction == "\nUse the tags, please.\n" and traj.finish_reason == "answer"
    assert RewardWorker(run.reward).score([traj])[0].reward == 1.0

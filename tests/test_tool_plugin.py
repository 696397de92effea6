"""A tool of a user's own with settings of its own (``examples/plugins/calculator_tool.py``), named by dotted path: its
settings are validated at start-up with one-line errors, and the loop the validated config builds offers it, calls
it with those settings and counts its errors; the RewardWorker grades the answer."""

from __future__ import annotations

import asyncio
import json

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.agents import build_agent_loop
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.io_struct import QARecord, RewardScore
from rlinf_search.tools.search import build_search_tool
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR

TOOL = "examples.plugins.calculator_tool:CalculatorTool"
END = "<|im_end|>"


def _config(tmp_path, **changes):
    cfg = OmegaConf.load("examples/searchr1/config/tiny-cpu.yaml")
    OmegaConf.update(cfg, "runner.output_dir", str(tmp_path))
    cfg.data.train_data_paths, cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")], []
    OmegaConf.update(cfg, "agent.protocol", "toolcall")
    OmegaConf.update(cfg, "data.max_prompt_length", 512)
    OmegaConf.update(cfg, "tools.calculate", {"class": TOOL})
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@pytest.mark.parametrize("section, message", [
    ({"class": TOOL, "decimals": 20},
     "tools.calculate.decimals must be in [0, 12], got 20"),
    ({"class": TOOL, "max_chars": "long"},
     "tools.calculate.max_chars: expected an integer, got 'long'"),
    ({"class": TOOL, "decimal": 2},
     "tools.calculate.decimal: unknown key; tool calculate takes decimals, max_chars; did you mean decimals?")])
def test_the_tools_own_keys_are_validated_at_start_up_in_one_line(tmp_path, section, message):
    with pytest.raises(ConfigError) as caught:
        validate_cfg(_config(tmp_path, **{"tools.calculate": section}))
    assert str(caught.value) == message


def test_a_section_named_otherwise_than_the_tools_schema_is_refused(tmp_path):
    cfg = _config(tmp_path, **{"tools.calc": {"class": TOOL}})
    del cfg.tools["calculate"]
    with pytest.raises(ConfigError, match="^tools.calc: the tool calls itself 'calculate'; name its section "
                                          "tools.calculate$"):
        validate_cfg(cfg)


def test_the_validated_config_builds_a_loop_that_calls_the_tool_with_its_settings(tmp_path, tiny_model_dir):
    run = validate_cfg(_config(tmp_path, **{"tools.calculate": {"class": TOOL, "decimals": 2},
                                            "algorithm.sampling_params.max_new_tokens": 256}))
    (spec,) = run.agent_loop.tools
    assert (spec.name, spec.factory, spec.settings) == ("calculate", TOOL, {"decimals": 2, "max_chars": 200})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)  # the tiny Qwen2 and its chat template
    record = QARecord(uid="years", prompt=[{"role": "user", "content": "How old was Chaplin in 1961?"}],
                      golden_answers=["72"], data_source="synth", question="How old was Chaplin in 1961?")

    def call(expression):
        return "<tool_call>\n" + json.dumps({"name": "calculate", "arguments": {"expression": expression}}) + \
            "\n</tool_call>"

    turns = ["\n".join([call("1961 - 1889"), call("2 / 3"), call("1 / 0"), call("open('x')")]) + END,
             "<answer> 72 </answer>" + END]

    async def run_one():
        client = build_search_tool(run.search)  # offered beside the calculator, not called here
        loop = build_agent_loop(ScriptedEngine(tokenizer, turns), client, tokenizer, run.agent_loop)
        try:
            return await loop.run(record)
        finally:
            await loop.aclose()
            await client.aclose()

    traj = asyncio.run(run_one())
    prompt = tokenizer.decode(traj.prompt_ids)
    assert '"name": "calculate"' in prompt and '"name": "search"' in prompt, "both schemas offered by the template"
    (observation,) = (span.text for span in traj.spans if span.kind == "tool")
    assert "72" in observation and "0.67" in observation, "decimals: 2 reached the tool the rank built"
    assert "Error: division by zero" in observation and "is not a number or arithmetic" in observation
    assert traj.tool_calls == {"calculate": 4}
    assert traj.tool_errors == {"calculate/math": 1, "calculate/arguments": 1}
    assert traj.finish_reason == "answer"
    assert RewardWorker(RewardConfig(score="em")).score([traj]) == [RewardScore(reward=1.0, em=1.0)]

"""Function calling (``agent.protocol: toolcall``): the tiny model's chat template with tools, the parser on
sampled text, exact observation masks, full agent loops through a real retrieval server on loopback in both
protocols, and the tool config files users bring (verl's YAML, rllm's JSON)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.agents import build_agent_loop
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.toolcall.loop import TemplateWithoutTools
from rlinf_search.agents.toolcall.parser import CallError, ToolCall, parse_tool_calls
from rlinf_search.agents.tools.search_function import DEFAULT_SEARCH_SCHEMA, ArgumentError, SearchFunction
from rlinf_search.agents.toolcall.tool_config import ToolConfigError, read_tool_config
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.io_struct import QARecord
from rlinf_search.data.prompts import render, resolve_template
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR
from tests.test_agent_loop import _segments
from tests.test_train_runner import _config, _metrics, _run, server, synth  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
TOOL_CONFIGS = ROOT / "tests" / "data" / "tool_configs"
TOOLS = {"search": DEFAULT_SEARCH_SCHEMA["function"]}
END = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _record(question: str = "Which magazine was started first, Arthur's Magazine or First for Women?") -> QARecord:
    row = json.loads((HOTPOT_DIR / "test.jsonl").read_text().splitlines()[0])
    return QARecord(uid="hotpot-0", prompt=[{"role": "user", "content": row["question"]}],
                    golden_answers=row["golden_answers"], data_source="hotpotqa", question=row["question"])


def _call(*queries: str, name: str = "search") -> str:
    return '<tool_call>\n{"name": "%s", "arguments": {"query_list": %s}}\n</tool_call>' % (name, json.dumps(list(queries)))


# ---- the template -------------------------------------------------------------------------------
def test_the_tiny_template_renders_tools_and_stays_plain_chatml_without_them(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"}]
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"
    with_tools = tokenizer.apply_chat_template(messages, tools=[DEFAULT_SEARCH_SCHEMA], tokenize=False,
                                               add_generation_prompt=True)
    system, rest = with_tools.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(DEFAULT_SEARCH_SCHEMA) in system and "<tool_call>" in system
    assert rest == "<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n", "the system turn is not repeated"
    # Two tool messages in a row are one user turn of <tool_response> blocks.
    turn = [{"role": "user", "content": "Who?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query_list": ["a"]}}}]},
            {"role": "tool", "content": "R1"}, {"role": "tool", "content": "R2"}]
    text = tokenizer.apply_chat_template(turn, tools=[DEFAULT_SEARCH_SCHEMA], tokenize=False)
    assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["a"]}}\n'
                         "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n"
                         "<tool_response>\nR2\n</tool_response><|im_end|>\n")


def test_the_toolcall_prompt_template_names_the_tool_and_the_answer_format_not_the_tags():
    text = render(resolve_template("toolcall"), "Who wrote X?")
    assert text.endswith("Question: Who wrote X?\n") and "<answer>" in text and "search tool" in text
    assert "<search>" not in text and "<information>" not in text


# ---- the parser, on text that went through the tokenizer as sampled ids would ---------------------
@pytest.mark.parametrize("text, expected", [
    (_call("Arthur's Magazine founded"), [ToolCall("search", {"query_list": ["Arthur's Magazine founded"]})]),
    (_call("a") + "\n" + _call("b", "c"), [ToolCall("search", {"query_list": ["a"]}),
                                           ToolCall("search", {"query_list": ["b", "c"]})]),
    ("<think> maybe " + _call("not this") + " </think> no call", []),
    ("<think> maybe " + _call("not this") + " </think>" + _call("this"), [ToolCall("search", {"query_list": ["this"]})]),
    ('<tool_call>\n{"name": "search", "arguments": {"query_list": ["a"]}\n</tool_call>', [CallError]),
    (_call("x", name="browse"), [CallError]),
    ('<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', [CallError]),
    ('<tool_call>\n{"name": "search", "arguments": {"query_list": ["a"]}}', [CallError]),
    ('<tool_call>\n{"name": "search", "arguments": "{\\"query_list\\": [\\"s\\"]}"}\n</tool_call>',
     [ToolCall("search", {"query_list": ["s"]})]),
], ids=["one", "two", "inside-think", "after-think", "malformed-json", "unknown-tool", "missing-argument",
        "unclosed", "arguments-as-json-string"])
def test_calls_are_parsed_from_sampled_text(tokenizer, text, expected):
    sampled = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True)
    calls = parse_tool_calls(sampled, TOOLS).calls
    assert len(calls) == len(expected)
    for got, want in zip(calls, expected):
        if want is CallError:
            assert isinstance(got, CallError) and got.reason
        else:
            assert got == want


def test_unknown_tool_and_bad_json_say_what_to_do():
    (unknown,) = parse_tool_calls(_call("x", name="browse"), TOOLS).calls
    assert "no tool named 'browse'" in unknown.reason and "search" in unknown.reason
    (bad,) = parse_tool_calls("<tool_call>{not json}</tool_call>", TOOLS).calls
    assert "not valid JSON" in bad.reason and '"name"' in bad.reason


def test_search_arguments_in_both_shapes():
    verl = SearchFunction.from_schema(DEFAULT_SEARCH_SCHEMA)
    assert verl.queries({"query_list": [" a ", "", "b"]}, 3) == (["a", "b"], 3)
    rllm = SearchFunction.from_schema(json.loads((TOOL_CONFIGS / "rllm_local_search.json").read_text()))
    assert rllm.name == "local_search" and rllm.queries({"query": "x", "top_k": 5}, 3) == (["x"], 5)
    for bad in ({"query": "x", "top_k": 0}, {"query": "  "}, {"other": 1}):
        with pytest.raises(ArgumentError):
            rllm.queries(bad, 3)


# ---- the loop -----------------------------------------------------------------------------------
@pytest.fixture
def search_tool(hotpot_server):
    return lambda: build_search_tool(SearchToolConfig(server_addr=hotpot_server.address, topk=2))


def test_toolcall_loop_masks_exactly_the_rendered_tool_turn(tokenizer, search_tool):
    turns = ["<think> two facts </think>\n" + _call("Arthur's Magazine", "First for Women") + "\n"
             + _call("magazine", name="browse") + END,
             "<answer> Arthur's Magazine </answer>" + END]
    config = AgentLoopConfig(max_turns=2, protocol="toolcall", max_obs_tokens=400, max_passage_tokens=30)

    async def run():
        tool = search_tool()
        try:
            return await build_agent_loop(ScriptedEngine(tokenizer, turns), tool, tokenizer, config).run(_record())
        finally:
            await tool.aclose()

    traj = asyncio.run(run())
    assert traj.finish_reason == "answer" and traj.num_turns == 2
    assert traj.num_searches == 2 and traj.queries == ["Arthur's Magazine", "First for Women"]
    assert traj.tool_call_errors == 1 and traj.search_errors == 0
    runs = _segments(traj)
    assert [mask for mask, _ in runs] == [1, 0, 1]
    # The model's ids are what it sampled; the observation is what the template adds after its turn.
    assert runs[0][1] == tokenizer.encode(turns[0], add_special_tokens=False)
    assert runs[2][1] == tokenizer.encode(turns[1], add_special_tokens=False)
    observation = tokenizer.decode(runs[1][1])
    assert observation.startswith("\n<|im_start|>user\n<tool_response>\nResults for ")
    assert observation.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert observation.count("<tool_response>") == 2, "one tool message per call, the bad one included"
    assert "Error: there is no tool named 'browse'" in observation and "Doc 1(Title: " in observation
    # The prompt carried the schema through the chat template.
    prompt = tokenizer.decode(traj.prompt_ids)
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "search"' in prompt
    assert [s.kind for s in traj.spans] == ["model", "tool", "model"]
    assert "Arthur's Magazine" in traj.graded_text and "<answer> Arthur's Magazine </answer>" in traj.graded_text
    # Re-rendering the conversation from messages would not give these ids (the call JSON is rewritten).
    assert traj.template_drift


def test_a_turn_without_a_call_ends_the_trajectory_and_one_past_the_limit_is_not_run(tokenizer, search_tool):
    no_call = ["I am not sure." + END]
    traj = asyncio.run(_one(tokenizer, search_tool, no_call, AgentLoopConfig(max_turns=2, protocol="toolcall")))
    assert traj.finish_reason == "eos" and traj.num_searches == 0 and sum(traj.response_mask) == len(traj.response_ids)
    over = [_call("a") + END, _call("b") + END]
    traj = asyncio.run(_one(tokenizer, search_tool, over, AgentLoopConfig(max_turns=1, protocol="toolcall")))
    assert traj.finish_reason == "max_turns" and traj.queries == ["a"]


async def _one(tokenizer, search_tool, turns, config):
    tool = search_tool()
    try:
        return await build_agent_loop(ScriptedEngine(tokenizer, turns), tool, tokenizer, config).run(_record())
    finally:
        await tool.aclose()


def test_a_long_tool_turn_is_cut_to_the_limit_keeping_the_template_frame(tokenizer, search_tool):
    config = AgentLoopConfig(max_turns=2, protocol="toolcall", max_obs_tokens=60, max_passage_tokens=150)
    traj = asyncio.run(_one(tokenizer, search_tool, [_call("Arthur's Magazine", "magazine") + END, "<answer> x </answer>" + END],
                            config))
    (_, observation), = [run for run in _segments(traj) if run[0] == 0]
    assert len(observation) <= 60
    assert tokenizer.decode(observation).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_both_protocols_run_through_the_real_server(tokenizer, search_tool):
    searchr1 = asyncio.run(_one(tokenizer, search_tool, ["<search> Arthur's Magazine </search>",
                                                         "<answer> Arthur's Magazine </answer>"],
                                AgentLoopConfig(max_turns=2)))
    toolcall = asyncio.run(_one(tokenizer, search_tool, [_call("Arthur's Magazine") + END,
                                                         "<answer> Arthur's Magazine </answer>" + END],
                                AgentLoopConfig(max_turns=2, protocol="toolcall")))
    for traj in (searchr1, toolcall):
        assert traj.finish_reason == "answer" and traj.queries == ["Arthur's Magazine"]
    assert [s.kind for s in searchr1.spans] == ["model", "information", "model"]
    assert [s.kind for s in toolcall.spans] == ["model", "tool", "model"]


def test_a_text_prompt_is_refused_in_one_line(tokenizer):
    loop = build_agent_loop(ScriptedEngine(tokenizer, []), None, tokenizer, AgentLoopConfig(protocol="toolcall"))
    record = QARecord(uid="t-1", prompt="Question: who?", golden_answers=["x"], data_source="t")
    with pytest.raises(ValueError, match="prompt t-1 is text"):
        asyncio.run(loop.run(record))


def test_a_template_without_tools_is_refused(tokenizer):
    plain = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with pytest.raises(TemplateWithoutTools, match="does not render tools"):
        build_agent_loop(ScriptedEngine(plain, []), None, plain, AgentLoopConfig(protocol="toolcall"))


# ---- tool config files --------------------------------------------------------------------------
def test_verl_and_rllm_tool_configs_load_unchanged():
    verl = read_tool_config(TOOL_CONFIGS / "verl_search_tool_config.yaml")
    assert verl.function.name == "search" and "query_list" in verl.function.function["parameters"]["properties"]
    assert verl.search_settings == {"server_addr": "127.0.0.1:8000", "max_concurrency": 120, "timeout_s": 30}
    rllm = read_tool_config(TOOL_CONFIGS / "rllm_local_search.json")
    assert rllm.function.name == "local_search" and rllm.search_settings == {}


def test_tool_config_files_that_cannot_work_are_refused_in_one_line(tmp_path):
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text((TOOL_CONFIGS / "verl_search_tool_config.yaml").read_text().replace("type: native", "type: mcp"))
    with pytest.raises(ToolConfigError, match="only native tools"):
        read_tool_config(mcp)
    url = tmp_path / "url.yaml"
    url.write_text((TOOL_CONFIGS / "verl_search_tool_config.yaml").read_text().replace("/retrieve", "/search"))
    with pytest.raises(ToolConfigError, match="must be http://host:port/retrieve"):
        read_tool_config(url)
    no_query = tmp_path / "tool.json"
    no_query.write_text(json.dumps({"name": "calc", "parameters": {"properties": {"x": {"type": "number"}}}}))
    with pytest.raises(ToolConfigError, match="one search tool .a schema taking query_list or query., found 0"):
        read_tool_config(no_query)


def test_the_run_config_takes_the_protocol_and_the_tool_config(tmp_path):
    cfg = OmegaConf.load(ROOT / "examples" / "searchr1" / "config" / "tiny-cpu.yaml")
    OmegaConf.update(cfg, "runner.output_dir", str(tmp_path))
    cfg.data.train_data_paths = cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    OmegaConf.update(cfg, "agent.protocol", "toolcall")
    OmegaConf.update(cfg, "tools.search.tool_config", str(TOOL_CONFIGS / "verl_search_tool_config.yaml"))
    OmegaConf.update(cfg, "tools.search.server_addr", "127.0.0.1:9000")
    config = validate_cfg(cfg)
    assert config.agent_loop.protocol == "toolcall"
    assert config.agent_loop.tool_schema["function"]["name"] == "search"
    assert config.search.server_addr == "127.0.0.1:8000" and config.search.max_concurrency == 120
    OmegaConf.update(cfg, "agent.protocol", "tags")
    with pytest.raises(ConfigError, match="agent.protocol"):
        validate_cfg(cfg)


def test_a_verl_tool_config_listing_several_tools_offers_each_or_names_the_one_nothing_serves(tmp_path):
    """verl's file lists search and access: both are offered, access by the registered tool on the search server
    (its tools.access section, where there is one, sets it); a tool nothing here serves stops the run in one line."""
    verl = yaml.safe_load((TOOL_CONFIGS / "verl_search_tool_config.yaml").read_text())
    access = {"class_name": "my_project.tools.AccessTool", "config": {"type": "native"},
              "tool_schema": {"type": "function", "function": {
                  "name": "access", "description": "Opens a page by URL.",
                  "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}}}
    file = tmp_path / "tools.yaml"
    file.write_text(yaml.safe_dump({"tools": [*verl["tools"], access]}))
    listed = read_tool_config(file).listed
    assert [(t.name, t.source) for t in listed] == [("access", "my_project.tools.AccessTool")]
    cfg = OmegaConf.load(ROOT / "examples" / "searchr1" / "config" / "tiny-cpu.yaml")
    OmegaConf.update(cfg, "runner.output_dir", str(tmp_path))
    cfg.data.train_data_paths = cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    OmegaConf.update(cfg, "agent.protocol", "toolcall")
    OmegaConf.update(cfg, "tools.search.tool_config", str(file))
    (spec,) = validate_cfg(cfg).agent_loop.tools
    assert spec.name == "access" and spec.settings["server_addr"] == "127.0.0.1:8000"
    OmegaConf.update(cfg, "tools.access", {"max_page_tokens": 64})
    (spec,) = validate_cfg(cfg).agent_loop.tools
    assert spec.settings["max_page_tokens"] == 64
    calculator = {"class_name": "verl.tools.gsm8k_tool.Gsm8kTool", "config": {"type": "native"},
                  "tool_schema": {"type": "function", "function": {
                      "name": "calc_gsm8k_reward", "parameters": {"type": "object", "properties": {}}}}}
    file.write_text(yaml.safe_dump({"tools": [*verl["tools"], calculator]}))
    with pytest.raises(ConfigError) as refused:
        validate_cfg(cfg)
    message = str(refused.value)
    assert "verl.tools.gsm8k_tool.Gsm8kTool (function 'calc_gsm8k_reward')" in message
    assert "tools.calc_gsm8k_reward section with class" in message and "\n" not in message


# ---- through the runner -------------------------------------------------------------------------
@pytest.mark.heavy  # a minute on 2 cores: Ray groups, the retrieval server and two training steps
def test_toolcall_trajectories_train_through_the_worker_groups(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    """Two GRPO steps with ``agent.protocol: toolcall`` through the rollout, reward and 2-rank actor groups, with an
    engine that calls the tool: every trajectory searches once through the real server and answers; the
    rollout dump shows the tool turn masked and the model's turns trained on."""
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{
        "agent.protocol": "toolcall", "rollout.rollout_backend": "tests.registry_plugins.tool_calling_engine",
        "algorithm.sampling_params.max_new_tokens": 160, "runner.max_steps": 2, "runner.val_check_interval": 0,
        "runner.rollout_dump": 4, "data.rollout_batch_size": 3, "data.max_prompt_length": 512, "runner.seq_length": 1024})
    cfg.cluster.cpu_slots_per_node = 2  # 2 actor ranks; the rollout shares are 2 and 1 prompts
    assert validate_cfg(cfg).agent_loop.protocol == "toolcall"
    result = _run(cfg, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/searches_per_trajectory"] == 1.0 and row["rollout/finish_answer"] == 1.0
        # Identical samples in a group give zero advantages, so the update is a real pass with nothing to learn.
        assert row["rollout/tool_call_errors"] == 0.0 and "actor/grad_norm" in row
    dumped = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert dumped, "runner.rollout_dump wrote step 1's trajectories"
    for row in dumped:
        assert [span["kind"] for span in row["response"]] == ["model", "tool", "model"], row["response"]
        assert row["response"][1]["text"].startswith("\n<|im_start|>user\n<tool_response>\n")
        assert row["queries"] and row["finish_reason"] == "answer"

"""Both protocols with real chat templates: Qwen2.5-Instruct's, Qwen3's hybrid-thinking one, and a Qwen3 variant whose
generation prompt opens ``<think>`` (tests/data/chat_templates), over a byte-level BPE with Qwen's added tokens at
their real ids (tests/qwen_tokenizer.py), through a real retrieval server.

For each template: the loop accepts it; at every turn boundary the ids the engine is given equal the template's
own render of the conversation so far (model turns written as the template writes calls); masks are exact; the
tool-response limit is never exceeded, not even by one token; a call written inside the reasoning is never run;
and ``template_drift`` reports exactly when a message-level re-render would change the ids.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from rlinf_search.agents import build_agent_loop
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.tools import search_tool
from rlinf_search.data.io_struct import QARecord
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR
from tests.qwen_tokenizer import build_qwen_tokenizer

TEMPLATES = ("qwen2.5-instruct.jinja", "qwen3.jinja", "qwen3-thinking-prompt.jinja")
END = "<|im_end|>"


@pytest.fixture(scope="module", params=TEMPLATES)
def tokenizer(request, tmp_path_factory):
    return build_qwen_tokenizer(tmp_path_factory.mktemp("qwen_tokenizer"), request.param)


def _thinks(tokenizer) -> bool:
    return "<think>" in tokenizer.chat_template


def _opens_thinking(tokenizer) -> bool:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    return prompt.endswith("<think>\n")


def _record() -> QARecord:
    row = json.loads((HOTPOT_DIR / "test.jsonl").read_text().splitlines()[0])
    return QARecord(uid="hotpot-0", prompt=[{"role": "user", "content": row["question"]}],
                    golden_answers=row["golden_answers"], data_source="hotpotqa", question=row["question"])


def _call_text(*calls: dict) -> str:
    """Calls as the template writes them (json with ", " and ": "), one per line."""
    return "\n".join('<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
                     % (c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls)


class _Recording:
    """The search tool, keeping every result text it returned (what the tool messages hold)."""

    def __init__(self, tool):
        self.tool, self.name, self.schema, self.error_kinds = tool, tool.name, tool.schema, tool.error_kinds
        self.results: list[str] = []

    async def call(self, arguments):
        result = await self.tool.call(arguments)
        self.results.append(result.text)
        return result

    async def aclose(self):
        await self.tool.aclose()


def _scripted_turns(tokenizer, reasoning: list[str], calls: list[list[dict]], answer: str) -> tuple[list[str], list]:
    """The model's turn texts in the template's own form, and the assistant messages they re-render as."""
    turns, messages = [], []
    for thought, turn_calls in zip(reasoning, calls + [[]]):
        think = f"<think>\n{thought}\n</think>" if thought else ""
        body = _call_text(*turn_calls) if turn_calls else answer
        separator = "\n\n" if _thinks(tokenizer) else "\n"  # Qwen3 puts a blank line after </think>, Qwen2.5 a newline
        text = f"{think}{separator}{body}" if think else body
        written = text[len("<think>\n"):] if _opens_thinking(tokenizer) else text
        turns.append(written + END)
        messages.append({"role": "assistant", "content": think if turn_calls else text,
                         "tool_calls": [{"type": "function", "function": c} for c in turn_calls]} if turn_calls
                        else {"role": "assistant", "content": text})
    return turns, messages


def _roll(tokenizer, server, turns, config):
    async def run():
        client = build_search_tool(SearchToolConfig(server_addr=server.address, topk=2))
        search = _Recording(search_tool(client, config, tokenizer))
        engine = ScriptedEngine(tokenizer, turns)
        loop = build_agent_loop(engine, {"search": search}, tokenizer, config)
        try:
            return await loop.run(_record()), engine, search, loop
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_ids_at_every_turn_boundary_are_the_templates_own_render(tokenizer, hotpot_server):
    thoughts = ["I should look Lilu up.", "Two more lookups.", "It says spirit."] if _thinks(tokenizer) else [""] * 3
    calls = [[{"name": "search", "arguments": {"query_list": ["Lilu mythology"]}}],
             [{"name": "search", "arguments": {"query_list": ["Alu"]}},
              {"name": "search", "arguments": {"query_list": ["Akkadian spirit"]}}]]
    turns, assistant = _scripted_turns(tokenizer, thoughts, calls, "<answer> a spirit </answer>")
    config = AgentLoopConfig(max_turns=3, protocol="toolcall", max_obs_tokens=600, max_passage_tokens=40)
    traj, engine, search, loop = _roll(tokenizer, hotpot_server, turns, config)
    assert traj.finish_reason == "answer" and traj.num_turns == 3 and traj.num_searches == 3
    # The conversation so far, as messages, rendered by the template: the ids each turn was generated from.
    messages = list(_record().prompt)
    results = iter(search.results)
    for turn, (prompt_ids, _) in enumerate(engine.calls):
        expected = tokenizer.apply_chat_template(messages, tools=loop.schemas, tokenize=False, add_generation_prompt=True)
        assert prompt_ids == tokenizer.encode(expected, add_special_tokens=False), f"turn {turn + 1}'s prompt"
        if turn < len(calls):
            messages.append(assistant[turn])
            messages += [{"role": "tool", "content": next(results)} for _ in calls[turn]]
    # Masks: the model's ids are exactly what it sampled, every observation id is masked.
    model_spans = [span for span in traj.spans if span.kind == "model"]
    for span, text in zip(model_spans, turns):
        assert traj.response_ids[span.start:span.end] == tokenizer.encode(text, add_special_tokens=False)
        assert set(traj.response_mask[span.start:span.end]) == {1}
    assert all(set(traj.response_mask[s.start:s.end]) == {0} for s in traj.spans if s.kind == "tool")
    assert not traj.template_drift, "turns in the template's own form re-render to the same ids"


def test_the_tool_response_limit_is_never_exceeded(tokenizer, hotpot_server):
    calls = [{"name": "search", "arguments": {"query_list": [q]}} for q in ("Lilu", "Alu", "spirit demon")]
    for limit in (61, 90, 137):
        config = AgentLoopConfig(max_turns=1, protocol="toolcall", max_obs_tokens=limit, max_passage_tokens=200)
        turns = [_call_text(*calls) + END, "<answer> x </answer>" + END]
        if _opens_thinking(tokenizer):
            turns = ["ok\n</think>\n\n" + turns[0], "ok\n</think>\n\n" + turns[1]]
        traj, *_ = _roll(tokenizer, hotpot_server, turns, config)
        (tool,) = [span for span in traj.spans if span.kind == "tool"]
        assert 0.8 * limit <= tool.end - tool.start <= limit, (limit, tool.end - tool.start)


def test_a_call_inside_the_reasoning_is_not_run_and_is_no_drift(tokenizer, hotpot_server):
    if not _thinks(tokenizer):
        pytest.skip("Qwen2.5's template has no reasoning block")
    inner = _call_text({"name": "search", "arguments": {"query_list": ["not this"]}})
    text = f"<think>\nMaybe {inner}? No.\n</think>\n\n<answer> a spirit </answer>"
    turn = (text[len("<think>\n"):] if _opens_thinking(tokenizer) else text) + END
    traj, *_ = _roll(tokenizer, hotpot_server, [turn], AgentLoopConfig(max_turns=2, protocol="toolcall"))
    assert traj.finish_reason == "answer" and traj.num_searches == 0 and traj.tool_calls == {}
    assert not traj.template_drift, "the call's text is the reasoning's: a re-render keeps it where it was"


def test_drift_is_reported_when_a_re_render_would_change_the_ids(tokenizer, hotpot_server):
    # Arguments written with other spacing than the template's own: a message-level pipeline rewrites them.
    turns = ['<tool_call>\n{"name":"search","arguments":{"query_list":["Lilu"]}}\n</tool_call>' + END,
             "<answer> a spirit </answer>" + END]
    if _opens_thinking(tokenizer):
        turns = ["ok\n</think>\n\n" + t for t in turns]
    traj, *_ = _roll(tokenizer, hotpot_server, turns, AgentLoopConfig(max_turns=2, protocol="toolcall"))
    assert traj.num_searches == 1 and traj.template_drift


def test_the_search_r1_protocol_runs_on_the_same_templates(tokenizer, hotpot_server):
    turns = ["<search> Lilu mythology </search>", "<answer> a spirit </answer>"]
    config = AgentLoopConfig(max_turns=2, max_obs_tokens=200, max_passage_tokens=40)
    traj, engine, *_ = _roll(tokenizer, hotpot_server, turns, config)
    assert traj.finish_reason == "answer" and [s.kind for s in traj.spans] == ["model", "information", "model"]
    prompt = tokenizer.apply_chat_template(_record().prompt, tokenize=False, add_generation_prompt=True)
    assert engine.calls[0][0] == tokenizer.encode(prompt, add_special_tokens=False), "no tools in its prompt"
    information = next(s for s in traj.spans if s.kind == "information")
    assert 0 < information.end - information.start <= 200

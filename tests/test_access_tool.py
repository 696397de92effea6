"""A second tool beside search: ``access`` opens a page by URL from the retrieval server's page store (``POST
/access``), as ASearcher's agents do. Through the function-calling loop and a real server on loopback, a
trajectory searches, opens the page a result names and answers, and the RewardWorker grades it; bad calls and
missing pages come back to the model as one line each and are counted per tool."""

from __future__ import annotations

import asyncio
import json

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.agents import build_agent_loop
from rlinf_search.agents.config import AgentLoopConfig, ToolSpec
from rlinf_search.agents.searchr1.metrics import rollout_metrics
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.io_struct import QARecord, RewardScore
from rlinf_search.retrieval.corpus import split_contents
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.tools.search import SearchToolConfig, build_search_tool
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.conftest import HOTPOT_DIR
from tests.test_toolcall import ROOT

END = "<|im_end|>"


def _url(title: str) -> str:
    return "https://en.wikipedia.org/wiki/" + title.replace(" ", "_")


@pytest.fixture(scope="module")
def pages_server(hotpot_index_dir, hotpot_corpus, tmp_path_factory):
    """BM25 over the HotpotQA passages, and each passage's page (its title and text) at its Wikipedia URL."""
    pages = tmp_path_factory.mktemp("pages") / "pages.jsonl"
    with open(pages, "w") as out:
        for line in hotpot_corpus.read_text().splitlines():
            title, text = split_contents(json.loads(line)["contents"])
            out.write(json.dumps({"url": _url(title), "title": title, "contents": text}) + "\n")
    args = ["--index-dir", str(hotpot_index_dir), "--corpus", str(hotpot_corpus), "--retriever", "bm25",
            "--pages", str(pages)]
    with RetrievalServerProcess(args) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _run(tokenizer, server, turns: list[str]):
    row = json.loads((HOTPOT_DIR / "test.jsonl").read_text().splitlines()[0])
    record = QARecord(uid="hotpot-0", prompt=[{"role": "user", "content": row["question"]}],
                      golden_answers=row["golden_answers"], data_source="hotpotqa", question=row["question"])
    access = ToolSpec("access", "access", {"server_addr": server.address, "max_page_tokens": 120, "timeout_s": 30.0})
    config = AgentLoopConfig(max_turns=3, protocol="toolcall", max_obs_tokens=400, max_passage_tokens=30,
                             tools=(access,))

    async def run():
        client = build_search_tool(SearchToolConfig(server_addr=server.address, topk=2))
        loop = build_agent_loop(ScriptedEngine(tokenizer, turns), client, tokenizer, config)
        try:
            return await loop.run(record)
        finally:
            await loop.aclose()
            await client.aclose()

    return asyncio.run(run())


def test_a_trajectory_searches_opens_a_page_and_answers(tokenizer, pages_server):
    answer = "<answer> a spirit </answer>" + END
    turns = [_call("search", {"query_list": ["Lilu mythology"]}) + END,
             _call("access", {"url": _url("Lilu (mythology)")}) + END, answer]
    traj = _run(tokenizer, pages_server, turns)
    assert traj.finish_reason == "answer" and [s.kind for s in traj.spans] == ["model", "tool", "model", "tool", "model"]
    assert traj.tool_calls == {"search": 1, "access": 1} and traj.tool_errors == {}
    assert traj.num_searches == 1 and traj.queries == ["Lilu mythology"], "the Search-R1 counts stay"
    search_result, page = (span.text for span in traj.spans if span.kind == "tool")
    assert "(Title: Lilu (mythology))" in search_result
    assert "<tool_response>\nTitle: Lilu (mythology)\nA lilu or lil" in page and "Akkadian" in page
    prompt = tokenizer.decode(traj.prompt_ids)
    assert '"name": "search"' in prompt and '"name": "access"' in prompt, "both schemas offered by the template"
    assert RewardWorker(RewardConfig(score="em")).score([traj]) == [RewardScore(reward=1.0, em=1.0)]
    metrics = rollout_metrics([traj])
    assert metrics["rollout/tool_calls/search"] == 1.0 and metrics["rollout/tool_calls/access"] == 1.0


def test_a_missing_page_and_a_call_without_url_are_one_line_each_and_counted(tokenizer, pages_server):
    calls = [_call("access", {"url": "https://nowhere.example/page"}), _call("access", {"url": 3}),
             _call("access", {"page": 3})]
    traj = _run(tokenizer, pages_server, ["\n".join(calls) + END, "<answer> no idea </answer>" + END])
    (observation,) = (span.text for span in traj.spans if span.kind == "tool")
    assert "No page found at https://nowhere.example/page." in observation
    assert "Error: access needs url, the page's address as a string" in observation
    assert "Error: access needs the argument(s) url" in observation, "the parser's check, before the tool runs"
    assert traj.tool_calls == {"access": 2} and traj.tool_errors == {"access/not_found": 1, "access/arguments": 1}
    assert traj.tool_call_errors == 2, "the two wrong calls count as the model's errors, the missing page does not"


def test_the_run_config_offers_access_with_the_search_server_and_refuses_what_cannot_work(tmp_path):
    cfg = OmegaConf.load(ROOT / "examples" / "searchr1" / "config" / "tiny-cpu.yaml")
    OmegaConf.update(cfg, "runner.output_dir", str(tmp_path))
    cfg.data.train_data_paths = cfg.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
    OmegaConf.update(cfg, "agent.protocol", "toolcall")
    OmegaConf.update(cfg, "data.max_prompt_length", 512)
    OmegaConf.update(cfg, "tools.access", {"max_page_tokens": 200})
    (spec,) = validate_cfg(cfg).agent_loop.tools
    assert spec.name == "access" and spec.settings["server_addr"] == cfg.tools.search.server_addr
    assert spec.settings["max_page_tokens"] == 200
    OmegaConf.update(cfg, "tools.access.enable", False)
    assert validate_cfg(cfg).agent_loop.tools == ()
    for changes, message in [({"tools.access": {"max_page_tokens": 0}},
                              r"tools.access.max_page_tokens must be >= 1, got 0"),
                             ({"tools.access": {"pages": 3}}, "tools.access.pages: unknown key; tool access takes "
                              "max_page_tokens, server_addr, timeout_s"),
                             ({"tools.access": {"timeout_s": "soon"}}, "tools.access.timeout_s: expected a "
                              "number, got 'soon'"),
                             ({"tools.browse": {"class": "no_such.module:Tool"}}, "tools.browse"),
                             ({"tools.browse": {"class": "rlinf_search.agents.tools.base:ToolResult"}},
                              "tools.browse: rlinf_search.agents.tools.base:ToolResult is not a tool class: it has "
                              "no schema and no call"),
                             ({"tools.access": {}, "agent.protocol": "searchr1"}, "only agent.protocol toolcall")]:
        bad = OmegaConf.load(ROOT / "examples" / "searchr1" / "config" / "tiny-cpu.yaml")
        OmegaConf.update(bad, "runner.output_dir", str(tmp_path))
        bad.data.train_data_paths = bad.data.val_data_paths = [str(HOTPOT_DIR / "test.jsonl")]
        OmegaConf.update(bad, "agent.protocol", "toolcall")
        OmegaConf.update(bad, "data.max_prompt_length", 512)
        for key, value in changes.items():
            OmegaConf.update(bad, key, value, merge=False)
        with pytest.raises(ConfigError, match=message) as caught:
            validate_cfg(bad)
        assert "\n" not in str(caught.value)

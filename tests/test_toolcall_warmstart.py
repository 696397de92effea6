"""The warm start and the eval in the function-calling protocol (``DEMO_PROTOCOL=toolcall``): the tiny model's
tool-calling tokenizer, scripted ``<tool_call>`` turns through the real agent loop and a real retrieval server
on the synthetic task, and the CLIs the demo runs."""

from __future__ import annotations

import asyncio
import json

import pytest
from transformers import AutoTokenizer

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.tools.search_function import DEFAULT_SEARCH_SCHEMA
from rlinf_search.data.prepare import prepare, write_records
from rlinf_search.data.prompt_tokens import PromptTokenizer
from rlinf_search.retrieval.build_index import main as build_index_main
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.rewards import compute_score
from toolkits.make_tiny_model import TOOL_TAGS, make_tiny_model
from toolkits.sft_scripts import BehaviourMix, SyntheticScripts, TurnStyle
from toolkits.sft_warmstart import _collect_from_server, search_probabilities
from toolkits.synth_task import SynthSpec, write_task
from toolkits.warmstart_probes import decision_position


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """The synthetic task (300 people), its toolcall-prompted records, a BM25 server over its corpus, and tiny
    models with and without the tool-calling tokenizer."""
    out = tmp_path_factory.mktemp("synth_toolcall")
    paths = write_task(out / "data", SynthSpec(people=300, seed=3))
    for split in ("train", "val"):
        records = prepare([paths[split]], "flashrag", data_sources="synth", template="toolcall")
        write_records(records, out / f"{split}.prepared.jsonl")
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(out / "index"), "--retriever", "bm25"]) == 0
    texts = [paths["corpus"], paths["train"]]
    models = {"toolcall": make_tiny_model(out / "model_tc", texts, tool_calling=True),
              "plain": make_tiny_model(out / "model_plain", texts)}
    args = ["--index-dir", str(out / "index"), "--corpus", str(paths["corpus"]), "--retriever", "bm25"]
    with RetrievalServerProcess(args) as server:
        yield {"dir": out, "models": models, "server": server.address,
               "records": prepare([paths["train"]], "flashrag", data_sources="synth", template="toolcall")}


def test_tool_calling_tokenizer_has_the_tags_as_tokens_and_short_prompts(synth):
    tool_calling = AutoTokenizer.from_pretrained(synth["models"]["toolcall"])
    plain = AutoTokenizer.from_pretrained(synth["models"]["plain"])
    for tag in TOOL_TAGS:
        assert len(tool_calling.encode(tag, add_special_tokens=False)) == 1, tag
    assert len(plain.encode("<tool_call>", add_special_tokens=False)) > 1, "the Search-R1 tokenizer is unchanged"
    record = synth["records"][0]
    lengths = {name: len(PromptTokenizer(tok, tools=[DEFAULT_SEARCH_SCHEMA]).ids(record))
               for name, tok in (("toolcall", tool_calling), ("plain", plain))}
    assert lengths["toolcall"] < 0.6 * lengths["plain"], lengths


def test_scripted_tool_calls_run_through_the_real_loop_and_server(synth):
    """Good searches written as calls: each hop is one call that finds its passage, the answer is graded right,
    the ids are what the template renders (no drift), and the first token is the decision ``<tool_call>``."""
    tokenizer = AutoTokenizer.from_pretrained(synth["models"]["toolcall"])
    style = TurnStyle.for_protocol("toolcall", tokenizer)
    records = synth["records"][:24]
    scripts = SyntheticScripts(synth["records"], BehaviourMix(search=0.5, bad_query=0.2), style)
    config = AgentLoopConfig(max_turns=2, max_tokens_per_turn=64, max_obs_tokens=160, max_passage_tokens=48, topk=1,
                             protocol="toolcall")
    good = asyncio.run(_collect_from_server(records, lambda record, rng: scripts.good_search(record), tokenizer,
                                            synth["server"], config, 0))
    assert decision_position(tokenizer, style.search_open) == 0
    call_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    for record, traj in zip(records, good):
        assert traj.search_errors == traj.tool_call_errors == 0 and not traj.template_drift
        assert traj.num_searches == (2 if record.extra.get("bridge") else 1)
        assert traj.queries[0] == record.extra["subject"], "the search tool strips the scripted query's space"
        assert compute_score("em", traj.graded_text, record.golden_answers) == 1.0
        assert traj.response_ids[0] == call_id and traj.response_ids[-1] == tokenizer.eos_token_id
    mixed = asyncio.run(_collect_from_server(records, scripts, tokenizer, synth["server"], config, 0))
    assert {t.num_searches for t in mixed} >= {0, 1}, "guesses answer at once, searches call the tool"
    chances = search_probabilities(_model(synth), tokenizer, records[:4], style)
    assert all(0.0 < c < 1.0 for c in chances)


def _model(synth):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(synth["models"]["toolcall"], dtype=torch.float32)


def test_toolcall_warm_start_and_eval_clis(synth, tmp_path):
    """The demo's steps 5 and 6 in the toolcall protocol, a few steps each: the warm start saves a model the
    eval runner then rolls out with function calls against the same server."""
    from rlinf_search.runners.eval_runner import main as eval_main
    from toolkits.sft_warmstart import main as warm_start_main

    out = tmp_path / "sft"
    data = tmp_path / "train.prepared.jsonl"  # 16 questions: the collection and the search probe read them all
    write_records(synth["records"][:16], data)
    assert warm_start_main(["--model", str(synth["models"]["toolcall"]), "--data", str(data), "--server-addr",
                            synth["server"], "--out", str(out), "--topk", "1", "--protocol", "toolcall",
                            "--reading-steps", "2", "--skill-steps", "2", "--mix-steps", "2", "--batch-size", "4"]) == 0
    losses = json.loads((out / "sft_losses.json").read_text())
    assert len(losses["losses"]) == 6 and losses["config"]["protocol"] == "toolcall"
    assert eval_main(["--model", str(out), "--data", str(synth["dir"] / "val.prepared.jsonl"), "--server-addr",
                      synth["server"], "--topk", "1", "--max-samples", "3", "--max-new-tokens", "16",
                      "--protocol", "toolcall", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert len(report["trajectories"]) == 3


def test_a_scripted_call_spells_the_name_in_the_questions_tokens(synth):
    """The name in a scripted call's JSON string is the very token sequence it is in the question (after a space),
    so the warm start teaches a copy, not a second spelling of every name."""
    tokenizer = AutoTokenizer.from_pretrained(synth["models"]["toolcall"])
    style = TurnStyle.for_protocol("toolcall", tokenizer)
    scripts = SyntheticScripts(synth["records"], BehaviourMix(), style)
    for record in synth["records"][:24]:
        name = tokenizer.encode(" " + record.extra["subject"], add_special_tokens=False)
        question, call = (tokenizer.encode(text, add_special_tokens=False)
                          for text in (record.question, scripts.good_search(record)[0]))
        for ids in (question, call):
            assert any(ids[i: i + len(name)] == name for i in range(len(ids))), (record.question, record.extra)

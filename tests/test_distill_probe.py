"""examples/searchr1/distill_probe.py: the exact reverse KL on the student's own samples, split by role,
through the real agent loop, HF engine and retrieval server."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.test_train_runner import ROOT, server, synth  # noqa: F401 (fixtures)

SCRIPT = ROOT / "examples/searchr1/distill_probe.py"


def _module():
    spec = importlib.util.spec_from_file_location("distill_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_roles_follow_the_tags(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for text, inner in (("<search> Ver Zou </search>", "query"), ("<answer> Paris </answer>", "answer")):
        ids = tokenizer.encode(text, add_special_tokens=False)
        roles = _module().token_roles(tokenizer.decode, ids)
        assert roles[0] == roles[-1] == "other", "the tags themselves"
        assert set(roles[1:-1]) == {inner}, list(zip((tokenizer.decode([i]) for i in ids), roles))


def _probe(tmp_path, student, teacher, synth, server, name):  # noqa: F811
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--student", str(student), "--teacher", str(teacher),
                           "--data", str(synth / "val.prepared.jsonl"), "--server-addr", server.address,
                           "--prompts", "6", "--max-new-tokens", "16", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_the_kl_is_zero_against_itself_and_positive_against_another_model(tmp_path, tiny_model_dir, synth,  # noqa: F811
                                                                          server):  # noqa: F811
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    same = _probe(tmp_path, tiny_model_dir, tiny_model_dir, synth, server, "same")
    assert same["tokens"]["all"] > 0
    assert same["kl_mean"]["all"] == pytest.approx(0.0, abs=1e-6)
    torch.manual_seed(0)
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(0.05 * torch.randn_like(param))
    other.save_pretrained(tmp_path / "other")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "other")
    probe = _module()  # in-process this time: one subprocess start-up is enough for the CLI
    from rlinf_search.agents.config import AgentLoopConfig
    from rlinf_search.data.io_struct import SamplingParams
    from rlinf_search.data.prepare import load_records
    from rlinf_search.tools.search import SearchToolConfig

    loop = AgentLoopConfig(max_turns=2, max_tokens_per_turn=16, max_obs_tokens=160, max_passage_tokens=48,
                           sampling=SamplingParams(temperature=1.0))
    different = probe.probe(str(tiny_model_dir), str(tmp_path / "other"), load_records(synth / "val.prepared.jsonl")[:6],
                            SearchToolConfig(server_addr=server.address), loop)
    assert different.tokens == same["tokens"], "the same prompts and seeds give the same samples"
    assert different.mean() > 1e-3

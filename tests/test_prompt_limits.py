"""data.max_prompt_length is enforced: refused with the uid (default), dropped at start-up
(data.filter_overlong_prompts) or cut by the agent loop (data.truncation: left|right)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.config import ConfigError, validate_cfg
from rlinf_search.data.io_struct import QARecord
from rlinf_search.data.prompt_tokens import PromptLimit, PromptTokenizer, PromptTooLong
from rlinf_search.runners.prompt_sets import limit_prompts
from rlinf_search.workers.rollout.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _records(tokenizer, lengths: dict[str, int]) -> list[QARecord]:
    """Text prompts of exactly the given token counts (a repeated one-token word)."""
    word = next(w for w in (" the", " a", " of") if len(tokenizer.encode(w, add_special_tokens=False)) == 1)
    return [QARecord(uid=uid, prompt=word * n, golden_answers=["x"], data_source="t") for uid, n in lengths.items()]


def test_default_refuses_an_overlong_prompt_naming_its_uid(tokenizer):
    records = _records(tokenizer, {"ok-1": 10, "long-7": 21, "ok-2": 20})
    with pytest.raises(PromptTooLong, match=r"prompt long-7 \(in train\) has 21 tokens, over the limit of 20"):
        limit_prompts(records, tokenizer, PromptLimit(max_prompt_tokens=20), split="train")


def test_filter_drops_overlong_prompts_and_logs_the_count(tokenizer, caplog):
    records = _records(tokenizer, {"a": 5, "b": 30, "c": 20, "d": 31})
    with caplog.at_level(logging.WARNING):
        kept = limit_prompts(records, tokenizer, PromptLimit(max_prompt_tokens=20, filter_overlong=True), split="train")
    assert [r.uid for r in kept.records] == ["a", "c"] and kept.dropped == ["b", "d"]
    assert "dropped 2 of 4 train prompts over 20 tokens (first: b)" in caplog.text


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_cuts_in_the_agent_loop(tokenizer, side):
    text = "".join(f" w{i}" for i in range(60))
    record = QARecord(uid="r", prompt=text, golden_answers=["x"], data_source="t")
    full = PromptTokenizer(tokenizer).ids(record)
    assert len(full) > 24
    kept = limit_prompts([record], tokenizer, PromptLimit(max_prompt_tokens=24, truncation=side), split="train")
    assert kept.truncated == ["r"]
    loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, ["<answer> x </answer>"]), None, tokenizer,
                             AgentLoopConfig(max_prompt_tokens=24, truncation=side))
    traj = asyncio.run(loop.run(record))
    assert traj.prompt_ids == (full[-24:] if side == "left" else full[:24])


def test_agent_loop_refuses_when_nothing_was_checked(tokenizer):
    record = _records(tokenizer, {"long-1": 40})[0]
    loop = SearchR1AgentLoop(ScriptedEngine(tokenizer, []), None, tokenizer, AgentLoopConfig(max_prompt_tokens=20))
    with pytest.raises(PromptTooLong, match="prompt long-1 has 40 tokens"):
        asyncio.run(loop.run(record))


def test_config_keys(tmp_path):
    cfg = OmegaConf.load(ROOT / "examples/searchr1/config/tiny-cpu.yaml")
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n" * 32)
    cfg.data.train_data_paths = [str(data)]
    cfg.data.val_data_paths = []
    run = validate_cfg(cfg)
    assert run.prompt_limit == PromptLimit(max_prompt_tokens=128) and run.agent_loop.truncation == "error"
    cfg.data.truncation = "left"
    cfg.data.filter_overlong_prompts = True
    run = validate_cfg(cfg)
    assert run.prompt_limit.filter_overlong and run.agent_loop.truncation == "left"
    assert run.agent_loop.max_prompt_tokens == 128
    cfg.data.truncation = "middle"
    with pytest.raises(ConfigError, match="data.truncation: unknown 'middle'; choose one of error, left, right"):
        validate_cfg(cfg)


def test_training_entry_refuses_before_any_worker_starts(tmp_path, tiny_model_dir, tokenizer):
    """The overlong prompt is found at start-up: exit 2 with one line naming it; Ray never starts."""
    rows = [{"uid": f"q-{i}", "prompt": " the" * (10 if i != 5 else 400), "golden_answers": ["x"],
             "data_source": "t"} for i in range(16)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run(
        [sys.executable, "examples/searchr1/main_searchr1.py", f"runner.output_dir={tmp_path / 'run'}",
         f"rollout.model.model_path={tiny_model_dir}", f"data.train_data_paths=[{data}]", "data.val_data_paths=[]"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "config error: data.max_prompt_length: prompt q-5 (in data.train_data_paths) has" in done.stderr
    assert "Ray" not in done.stderr and "ray" not in done.stdout.lower()

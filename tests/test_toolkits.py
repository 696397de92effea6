"""Toolkits: the tiny model maker and the synthetic task generator."""

from __future__ import annotations

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from rlinf_search.retrieval.corpus import CorpusStore
from toolkits.make_tiny_model import PROTOCOL_TAGS
from toolkits.synth_task import SynthSpec, write_task


def test_tiny_model_loads_like_any_hf_model(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tokenizer)
    for tag in PROTOCOL_TAGS:  # single tokens, kept when special tokens are skipped
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == tag
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Who?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.decode(tokenizer.encode(" Über café")) == " Über café"


def test_synth_task_is_deterministic_disjoint_and_in_the_real_formats(tmp_path):
    spec = SynthSpec(people=100, seed=7)
    first = write_task(tmp_path / "a", spec)
    second = write_task(tmp_path / "b", spec)
    for key in first:
        assert first[key].read_bytes() == second[key].read_bytes(), key
    splits = {k: [json.loads(line) for line in first[k].read_text().splitlines()] for k in ("train", "val", "test")}
    subjects = {k: {row["metadata"]["subject"] for row in rows} for k, rows in splits.items()}
    assert not subjects["train"] & subjects["test"] and not subjects["train"] & subjects["val"]
    assert sum(len(rows) for rows in splits.values()) == 100
    assert {row["metadata"]["hops"] for row in splits["train"]} == {1, 2}
    store = CorpusStore(first["corpus"])
    titles = {store[i].title for i in range(len(store))}
    assert subjects["test"] <= titles, "every question's subject has a passage"
    two_hop = next(row for row in splits["test"] if row["metadata"]["hops"] == 2)
    bridge = two_hop["metadata"]["bridge"]
    city_passage = next(store[i] for i in range(len(store)) if store[i].title == bridge)
    assert two_hop["golden_answers"][0] in city_passage.text


def test_memory_plan_counts_the_parameters_of_every_qwen_shape():
    """The plan's 16 B a parameter of state is exact only if it counts the model's parameters exactly."""
    import torch
    from transformers import Qwen2ForCausalLM

    from toolkits.memory_plan import plan_actor_memory
    from toolkits.model_shapes import QWEN25_SHAPES, qwen_config

    for shape in QWEN25_SHAPES:
        config = qwen_config(shape)
        with torch.device("meta"):
            params = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
        assert plan_actor_memory(config, ranks=1, mbs_tokens=1).state == 16 * params, shape
    plan = plan_actor_memory(qwen_config("qwen2.5-3b"), ranks=8, mbs_tokens=8192, reference=True)
    assert 13.5 < plan.total / 2 ** 30 < 14.0  # docs/recipes.md: "about 14 GiB"

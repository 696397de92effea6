"""The HF engine's lean decode step on a real tiny Qwen2: the logits transformers' forward gives, through the
engine's own cache layers and left-padded rows, the same tokens through the engine, and off wherever it was not
checked (or its probe disagrees)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.workers.rollout import lean_decode
from rlinf_search.workers.rollout.hf_cache import cache_kwargs
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine
from rlinf_search.workers.rollout.kv_room import with_room
from rlinf_search.workers.rollout.lean_decode import (
    LeanDecoder,
    lean_decoder,
    unsupported_reason,
)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _prefilled(model, ids: torch.Tensor, mask: torch.Tensor):
    cache = with_room(DynamicCache())
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache), use_cache=True)
    return cache, positions[:, -1] + 1


def test_twelve_steps_give_transformers_logits_on_left_padded_rows(model):
    torch.manual_seed(0)
    rows, width = 5, 9
    ids = torch.randint(3, model.config.vocab_size, (rows, width))
    mask = torch.ones(rows, width, dtype=torch.long)
    for row, padding in enumerate((0, 3, 8, 1, 5)):
        mask[row, :padding] = 0
    theirs_cache, position = _prefilled(model, ids, mask)
    mine_cache, _ = _prefilled(model, ids, mask)
    decoder = LeanDecoder(model)
    token = torch.randint(3, model.config.vocab_size, (rows,))
    with torch.inference_mode():
        for _ in range(12):
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
            theirs = model(input_ids=token[:, None], attention_mask=mask, position_ids=position[:, None],
                           **cache_kwargs(model, theirs_cache), use_cache=True).logits[:, -1]
            mine = decoder.step(token, position, mask, mine_cache)
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
            token, position = theirs.argmax(-1), position + 1
    for a, b in zip(mine_cache.layers, theirs_cache.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


def test_the_engine_samples_the_same_tokens_with_and_without_it(tiny_model_dir):
    lean = HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=3))
    plain = HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=3, lean_decode=False))
    assert lean.lean is not None and plain.lean is None
    prompts = [lean.tokenizer.encode(t) for t in ("Who", "If Gallu is a demon Lilu is what? Think and search.",
                                                  "Christopher Nolan directed")]
    sampling = [SamplingParams(max_new_tokens=20, temperature=1.0, stop_at_eos=False, seed=s) for s in range(3)]

    async def run(engine):
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, sampling)))

    for a, b in zip(asyncio.run(run(lean)), asyncio.run(run(plain))):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_off_where_it_was_not_checked(tiny_model_dir, model):
    assert unsupported_reason(model) is None
    half = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    assert unsupported_reason(half) == "dtype torch.bfloat16" and lean_decoder(half) is None
    scaled = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    scaled.model.rotary_emb.rope_type = "linear"
    assert unsupported_reason(scaled) == "rotary scaling"


def test_a_probe_that_disagrees_turns_it_off_with_a_warning(model, monkeypatch, caplog):
    real_init = LeanDecoder.__init__

    def wrong_scale(self, module):
        real_init(self, module)
        self.scaling *= 2  # what a changed attention formula would do

    monkeypatch.setattr(LeanDecoder, "__init__", wrong_scale)
    with caplog.at_level(logging.WARNING, logger=lean_decode.__name__):
        assert lean_decoder(model) is None
    assert "differ from transformers'" in caplog.text

"""The HF engine's prefix reuse on a real tiny Qwen2: a turn that continues a cached context, or a prompt sent by a
whole group, samples what a full prefill would, with the log-probs teacher forcing gives, and prefills less."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine
from rlinf_search.workers.rollout.prefix_cache import (
    CachedPrefix,
    PrefixCache,
    prefill_inputs,
    shared_prefix_length,
)

GREEDY = SamplingParams(max_new_tokens=12, greedy=True, stop_at_eos=False)


@pytest.fixture()
def engines(tiny_model_dir):
    """One engine that reuses prefixes and one that prefills every prompt whole, on the same weights."""
    return (HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=1)),
            HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=1, prefix_cache_tokens=0,
                                              shared_prefix_tokens=0)))


def _teacher_forced(engine, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = engine.model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


def _first_turns(engine, prompts: list[list[int]]) -> list:
    """Each prompt's first turn, stopped at the first token the model writes after the third (a 'tool call')."""
    async def run():
        outs = []
        for prompt in prompts:
            probe = await engine.generate(prompt, GREEDY)
            stop = engine.tokenizer.decode(probe.output_ids[3:4])
            assert stop.strip(), "the test needs a visible stop text"
            outs.append(await engine.generate(prompt, SamplingParams(max_new_tokens=12, greedy=True,
                                                                     stop_at_eos=False, stop=(stop,))))
        return outs
    return asyncio.run(run())


def _next_turns(engine, contexts: list[list[int]]) -> list:
    async def run():
        return await asyncio.gather(*(engine.generate(c, GREEDY) for c in contexts))
    return asyncio.run(run())


def test_a_turn_after_a_stop_prefills_only_what_is_new_and_samples_what_a_whole_prefill_does(engines):
    reusing, whole = engines
    prompts = [reusing.tokenizer.encode(t) for t in ("Who directed Inception? Search first.",
                                                     "If Gallu is a demon Lilu is what?")]
    observation = reusing.tokenizer.encode(" <information> Doc 1 (Title: Inception) a 2010 film </information>")
    contexts = []
    for prompt, turn in zip(prompts, _first_turns(reusing, prompts)):
        assert turn.finish_reason == "stop"
        contexts.append(prompt + turn.output_ids + observation)
    assert len(reusing.prefix_cache) == 2
    before = reusing.stats.prefilled_tokens
    reused = _next_turns(reusing, contexts)
    prefilled = reusing.stats.prefilled_tokens - before
    # Each context's cached part is its prompt and its turn but the last token: that token and the observation remain.
    assert prefilled == 2 * (1 + len(observation))
    assert reusing.stats.reused_tokens == sum(len(c) - 1 - len(observation) for c in contexts)
    assert len(reusing.prefix_cache) == 0, "an entry is taken by the turn that continues it"
    plain = _next_turns(whole, contexts)
    assert whole.stats.reused_tokens == 0
    for context, a, b in zip(contexts, reused, plain):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), _teacher_forced(reusing, context, a.output_ids),
                                   atol=2e-4, rtol=0)


def test_rows_that_wrote_the_same_turn_each_continue_from_the_cache(engines):
    """A group's samples often write the same turn word for word (greedy here): every one of their next turns
    reuses the cached states, and samples what a whole prefill does."""
    reusing, whole = engines
    prompt = reusing.tokenizer.encode("Who directed Inception? Search first.")
    (first,) = _first_turns(reusing, [prompt])
    stop = first.stop_string

    async def same_turns(engine):
        sampling = SamplingParams(max_new_tokens=12, greedy=True, stop_at_eos=False, stop=(stop,))
        return await asyncio.gather(*(engine.generate(prompt, sampling) for _ in range(3)))

    turns = asyncio.run(same_turns(reusing))
    assert len({tuple(t.output_ids) for t in turns}) == 1 and turns[0].finish_reason == "stop"
    observation = reusing.tokenizer.encode(" <information> Doc 1 (Title: Inception) a 2010 film </information>")
    contexts = [prompt + t.output_ids + observation + reusing.tokenizer.encode(f" row {row}")
                for row, t in enumerate(turns)]
    reused_before = reusing.stats.reused_tokens
    reused = _next_turns(reusing, contexts)
    cached = len(prompt) + len(turns[0].output_ids) - 1
    assert reusing.stats.reused_tokens - reused_before == 3 * cached, "each copy's continuation took the states"
    assert len(reusing.prefix_cache) == 1, "the first turn's entry (prefix_cache.store of _first_turns) remains"
    for context, a, b in zip(contexts, reused, _next_turns(whole, contexts)):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), _teacher_forced(reusing, context, a.output_ids),
                                   atol=2e-4, rtol=0)


def test_a_prompt_sent_by_a_whole_group_is_prefilled_once(engines):
    reusing, whole = engines
    prompt = reusing.tokenizer.encode("Are Christopher Nolan and Sathish Kalathil both film directors?")
    other = reusing.tokenizer.encode("Who")
    sampling = [SamplingParams(max_new_tokens=10, temperature=1.0, stop_at_eos=False, seed=s) for s in range(4)]

    async def group(engine):
        jobs = [engine.generate(prompt, s) for s in sampling] + [engine.generate(other, GREEDY)]
        return await asyncio.gather(*jobs)

    # How many of them one prefill admits depends on the engine thread's timing: the pass itself is checked below.
    shared = asyncio.run(group(reusing))
    assert reusing.stats.prefilled_tokens < 4 * len(prompt) + len(other) or reusing.stats.prefills > 1
    separate = asyncio.run(group(whole))
    for a, b in zip(shared, separate):
        assert a.output_ids == b.output_ids
    for out in shared[:4]:
        torch.testing.assert_close(torch.tensor(out.logprobs), _teacher_forced(reusing, prompt, out.output_ids),
                                   atol=2e-4, rtol=0)
    assert len({tuple(o.output_ids) for o in shared[:4]}) > 1, "each row samples with its own seed"


def test_one_prefill_pass_computes_each_distinct_prompt_once_after_its_prefix():
    entry = CachedPrefix((7, 8), [torch.ones(2, 2, 3)], [torch.full((2, 2, 3), 2.0)])
    inputs = prefill_inputs([[1, 2, 3], [1, 2, 3], [7, 8, 9, 10], [1, 2, 3], [4]], [None, None, entry, None, None],
                            pad_id=0)
    assert inputs.rows.tolist() == [0, 0, 1, 0, 2]
    assert inputs.input_ids.tolist() == [[1, 2, 3], [0, 9, 10], [0, 0, 4]]
    # Two prefix columns (the entry's two tokens), then the suffixes' three.
    assert inputs.attention_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 0, 1, 1], [0, 0, 0, 0, 1]]
    assert inputs.position_ids.tolist() == [[0, 1, 2], [0, 2, 3], [0, 0, 0]]
    (keys, values), = inputs.prefix
    assert keys.shape == (3, 2, 2, 3) and keys[1].eq(1).all() and keys[0].eq(0).all() and values[1].eq(2).all()


def test_new_weights_drop_every_cached_prefix(engines):
    reusing, whole = engines
    prompt = reusing.tokenizer.encode("Who directed Inception? Search first.")
    (turn,) = _first_turns(reusing, [prompt])
    assert len(reusing.prefix_cache) == 1
    state = {k: v + 0.01 * torch.randn_like(v) for k, v in whole.model.state_dict().items()}
    reusing.update_weights(state)
    whole.update_weights(state)
    assert len(reusing.prefix_cache) == 0
    context = prompt + turn.output_ids + reusing.tokenizer.encode(" more")
    (a,), (b,) = _next_turns(reusing, [context]), _next_turns(whole, [context])
    assert reusing.stats.reused_tokens == 0 and a.output_ids == b.output_ids


def test_the_cache_keeps_the_newest_entries_within_its_token_budget_and_never_a_whole_prompt():
    cache = PrefixCache(max_tokens=10)
    state = [torch.zeros(1, 4, 2)]
    cache.store([1, 2, 3, 4], state, state)
    cache.store([1, 2], state, state)
    cache.store([5, 6, 7, 8, 9], state, state)  # 11 tokens: the oldest entry goes
    assert len(cache) == 2
    assert cache.take([1, 2, 3, 4, 5]).ids == (1, 2), "[1, 2, 3, 4] was evicted"
    assert cache.take([5, 6, 7, 8, 9]) is None, "a prompt equal to an entry leaves no token to prefill"
    assert cache.take([5, 6, 7, 8, 9, 10]).ids == (5, 6, 7, 8, 9)
    assert len(cache) == 0 and cache.hits == 2 and cache.reused_tokens == 7
    cache.store(list(range(11)), state, state)  # longer than the whole budget: not kept
    assert len(cache) == 0
    cache.store([1, 2, 3], state, state)
    cache.store([1, 2, 3], state, state)  # a second row wrote the same tokens: one entry, two continuations
    assert len(cache) == 1
    assert cache.take([1, 2, 3, 4]).ids == (1, 2, 3) and len(cache) == 1
    assert cache.take([1, 2, 3, 5]).ids == (1, 2, 3) and len(cache) == 0
    assert cache.take([1, 2, 3, 6]) is None


def test_prompts_that_start_alike_have_their_shared_start_computed_once(engines):
    """A batch's prompts share a template: it is computed once, and each prompt from where they part samples what a
    whole prefill does."""
    reusing, whole = engines
    template = ("Answer the question. To look a fact up, write <search> query </search>; the results come back "
                "between <information> and </information>. Question: ")
    questions = ("Who directed Inception?", "Where was Lilu born?", "Which company did Lir Ver work for?", "Who")
    prompts = [reusing.tokenizer.encode(template + q) for q in questions]
    shared = shared_prefix_length(prompts, min_tokens=1)
    assert shared >= 20
    (out_a, out_b) = [asyncio.run(_group(engine, prompts)) for engine in (reusing, whole)]
    assert whole.stats.prefilled_tokens == sum(len(p) for p in prompts)
    assert reusing.stats.prefilled_tokens == whole.stats.prefilled_tokens - (len(prompts) - 1) * shared
    for prompt, a, b in zip(prompts, out_a, out_b):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), _teacher_forced(reusing, prompt, a.output_ids),
                                   atol=2e-4, rtol=0)


async def _group(engine, prompts):
    return await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))


def test_the_shared_start_is_what_every_prompt_has_before_its_last_token_and_only_where_it_saves_enough():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]], min_tokens=1) == 2
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]], min_tokens=5) == 0, "2 x 2 saved"
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4]], min_tokens=1) == 2, "each prompt keeps a token"
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]], min_tokens=1) == 0, "one distinct prompt"
    assert shared_prefix_length([[7, 2], [1, 2]], min_tokens=1) == 0

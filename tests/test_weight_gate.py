"""The weight gate with the real HF engine: weights change between two requests, never inside one.

Requests in flight when a swap is asked for finish on the weights they started with and report that version;
the swap loads only once none is in flight; a request that arrives meanwhile waits and runs on the new weights.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine
from rlinf_search.workers.rollout.weight_gate import GatedEngine, WeightGate

GREEDY = SamplingParams(max_new_tokens=40, greedy=True, stop_at_eos=False)
LONG = SamplingParams(max_new_tokens=200, greedy=True, stop_at_eos=False)
"""Long enough that a swap asked for after a few tokens lands inside the turn on a loaded machine."""


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), device="cpu", seed=0))


def _shifted(engine: HFGenerationEngine) -> dict[str, torch.Tensor]:
    """Other weights: every tensor moved enough that greedy decoding changes."""
    generator = torch.Generator().manual_seed(1)
    return {name: value + 0.5 * torch.randn(value.shape, generator=generator)
            for name, value in engine.model.state_dict().items()}


def test_requests_in_flight_finish_on_their_weights_and_later_ones_start_on_the_new(engine):
    prompt = engine.tokenizer.encode("Where was Ada Lovelace born?")
    original = {name: value.clone() for name, value in engine.model.state_dict().items()}
    new = _shifted(engine)
    gate = WeightGate()
    gated = GatedEngine(engine, gate)
    before = asyncio.run(gated.generate(prompt, GREEDY))
    engine.update_weights(new)
    after = asyncio.run(engine.generate(prompt, GREEDY))
    engine.update_weights(original)
    assert before.output_ids != after.output_ids, "the new weights decode differently"
    assert before.weight_version == 0

    seen: dict[str, int] = {}
    tokens_before = engine.stats.generated_tokens

    def load() -> None:
        # Token counts, not clocks: the event loop resumes an awaiting coroutine after the gate has already let the
        # swap thread in, so a timestamp taken on resume can come after the load it should precede.
        seen["tokens_at_load"] = engine.stats.generated_tokens - tokens_before
        seen["in_flight_at_load"] = gate.activity().in_flight
        engine.update_weights(new)

    async def scenario():
        first = [asyncio.create_task(gated.generate(prompt, GREEDY)) for _ in range(3)]
        while gate.activity().in_flight < 3:
            await asyncio.sleep(0.001)
        swap = threading.Thread(target=gate.swap, args=(load, 7))
        swap.start()
        while gate.is_open:
            await asyncio.sleep(0.001)
        late = asyncio.create_task(gated.generate(prompt, GREEDY))  # arrives while the gate is closed
        for task in first:
            await task
        result = await late
        await asyncio.to_thread(swap.join)
        return [t.result() for t in first], result

    in_flight, late = asyncio.run(scenario())
    for out in in_flight:
        assert out.weight_version == 0 and out.output_ids == before.output_ids, "finished on the weights it began with"
    assert seen["in_flight_at_load"] == 0
    assert seen["tokens_at_load"] == 3 * len(before.output_ids), "loaded after the three finished, before the late one"
    assert late.weight_version == 7 and late.output_ids == after.output_ids, "the waiting request ran on the new weights"
    assert gate.version == 7 and gate.is_open
    activity = gate.activity()
    assert activity.requests == 5 and activity.in_flight == 0 and activity.busy_s > 0
    engine.update_weights(original)


def test_a_swap_with_nothing_in_flight_loads_at_once_and_a_stuck_one_says_why(engine):
    gate = WeightGate()
    loads = []
    gate.swap(lambda: loads.append(1), 1)
    assert loads == [1] and gate.version == 1

    async def hold():
        await gate.enter()  # a request that never leaves

    asyncio.run(hold())
    with pytest.raises(RuntimeError, match="1 generate requests were still running"):
        gate.swap(lambda: loads.append(2), 2, timeout_s=0.2)
    assert loads == [1] and gate.version == 1 and gate.is_open, "nothing loaded, and the gate reopened"


def _generate_across_swap(gated: GatedEngine, engine: HFGenerationEngine, prompt: list[int], weights, version: int,
                          tokens: int):
    """``gated.generate(prompt, LONG)`` while a thread swaps ``weights`` in as ``version`` once the engine has
    sampled ``tokens`` tokens more, as a weight sync's receiver does; the request's output."""
    start = engine.stats.generated_tokens

    def swap():
        while engine.stats.generated_tokens < start + tokens:
            time.sleep(0.0005)
        gated.load_weights(weights, version)

    async def scenario():
        task = asyncio.create_task(gated.generate(prompt, LONG))
        swapper = threading.Thread(target=swap)
        swapper.start()
        out = await task
        await asyncio.to_thread(swapper.join)
        return out

    return asyncio.run(scenario())


def test_an_aborted_request_continues_to_the_same_tokens_when_the_weights_did_not_change(engine):
    prompt = engine.tokenizer.encode("Where was Ada Lovelace born?")
    whole = asyncio.run(engine.generate(prompt, LONG))
    same = {name: value.clone() for name, value in engine.model.state_dict().items()}
    gate = WeightGate()
    gated = GatedEngine(engine, gate)
    assert gated.interrupts


    out = _generate_across_swap(gated, engine, prompt, same, 1, tokens=10)
    assert gate.activity().aborted == 1 and gate.activity().swaps == 1
    assert out.output_ids == whole.output_ids and out.finish_reason == whole.finish_reason
    assert out.logprobs == pytest.approx(whole.logprobs, abs=1e-4), "the re-prefill scores the same tokens alike"
    cut = out.token_versions.index(1)
    assert 10 <= cut < len(out.output_ids) and set(out.token_versions[:cut]) == {0}
    assert set(out.token_versions[cut:]) == {1} and out.weight_version == 0


def test_a_swap_inside_a_turn_gives_each_token_the_version_that_sampled_it(engine):
    prompt = engine.tokenizer.encode("Who wrote the first published algorithm?")
    original = {name: value.clone() for name, value in engine.model.state_dict().items()}
    old = asyncio.run(engine.generate(prompt, LONG))
    gate = WeightGate(version=3)
    gated = GatedEngine(engine, gate)


    try:
        out = _generate_across_swap(gated, engine, prompt, _shifted(engine), 4, tokens=12)
        cut = out.token_versions.index(4)
        assert out.output_ids[:cut] == old.output_ids[:cut], "the old weights' tokens are kept as sampled"
        rest = asyncio.run(engine.generate(prompt + out.output_ids[:cut],
                                           SamplingParams(max_new_tokens=LONG.max_new_tokens - cut, greedy=True, stop_at_eos=False)))
        assert out.output_ids[cut:] == rest.output_ids, "the rest is the new weights' continuation of the same tokens"
        assert out.output_ids != old.output_ids
        assert out.token_versions == [3] * cut + [4] * (LONG.max_new_tokens - cut) and out.weight_version == 3
        assert len(out.logprobs) == len(out.output_ids) == LONG.max_new_tokens and out.finish_reason == "length"
    finally:
        engine.update_weights(original)


def test_a_gate_that_drains_lets_the_turn_finish_on_the_old_weights(engine):
    prompt = engine.tokenizer.encode("Where was Ada Lovelace born?")
    original = {name: value.clone() for name, value in engine.model.state_dict().items()}
    old = asyncio.run(engine.generate(prompt, LONG))
    gate = WeightGate()
    gated = GatedEngine(engine, gate, interrupt=False)


    try:
        out = _generate_across_swap(gated, engine, prompt, _shifted(engine), 1, tokens=5)
        assert out.output_ids == old.output_ids and out.token_versions == [0] * LONG.max_new_tokens
        assert gate.activity().aborted == 0 and gate.version == 1
    finally:
        engine.update_weights(original)


def test_a_stop_string_split_by_an_abort_still_ends_the_turn(engine):
    from rlinf_search.workers.rollout.weight_gate import _stop_across

    tokenizer = engine.tokenizer
    ids = tokenizer.encode("I will look it up. <search> Ada Lovelace </search> and more text after it")
    text_ids = [tokenizer.decode(ids[:k]) for k in range(len(ids) + 1)]
    end = next(k for k, text in enumerate(text_ids) if "</search>" in text)
    inside = end - 1  # the abort fell inside the stop string: the last token completes it
    assert _stop_across(tokenizer, ids, inside, ("</search>",)) == (end, "</search>")
    assert _stop_across(tokenizer, ids[:end - 1] + tokenizer.encode(" nothing"), inside, ("</search>",)) is None


class _ScriptedSegments:
    """An engine answering each call with the next scripted (text, finish) segment: aborts where the script says."""

    def __init__(self, tokenizer, segments):
        self.tokenizer, self.segments, self.calls = tokenizer, list(segments), []

    async def generate(self, prompt_ids, sampling):
        from rlinf_search.data.io_struct import GenerationOutput

        self.calls.append((list(prompt_ids), sampling))
        text, finish = self.segments.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return GenerationOutput(ids, [-1.0] * len(ids), finish)


def test_a_stop_string_split_over_two_aborts_ends_the_turn_right_after_it(engine):
    tokenizer = engine.tokenizer
    segments = [("I will look: <sea", "abort"), ("rch> Ada </sea", "abort"), ("rch> and then more words", "length")]
    scripted = _ScriptedSegments(tokenizer, segments)
    gate = WeightGate()
    gated = GatedEngine(scripted, gate)
    sampling = SamplingParams(max_new_tokens=100, stop=("</search>",), seed=3)
    out = asyncio.run(gated.generate(tokenizer.encode("q"), sampling))
    assert tokenizer.decode(out.output_ids).endswith("</search>") and out.finish_reason == "stop"
    assert out.stop_string == "</search>" and gate.activity().aborted == 2
    continued = scripted.calls[1][1]
    assert continued.max_new_tokens < 100 and continued.seed not in (None, 3), "the rest of the turn, seeded anew"

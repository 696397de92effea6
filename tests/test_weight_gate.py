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

    seen: dict[str, float] = {}

    def load() -> None:
        seen["loaded_at"] = time.perf_counter()
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
        done_at = []
        for task in first:
            await task
            done_at.append(time.perf_counter())
        result = await late
        await asyncio.to_thread(swap.join)
        return [t.result() for t in first], done_at, result

    in_flight, done_at, late = asyncio.run(scenario())
    for out in in_flight:
        assert out.weight_version == 0 and out.output_ids == before.output_ids, "finished on the weights it began with"
    assert seen["in_flight_at_load"] == 0 and seen["loaded_at"] >= max(done_at) - 1e-3
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

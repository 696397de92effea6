"""The simulated engine, trainer and retriever of benchmarks/pipeline.py, and the benchmark itself.

The simulation is only worth its table if the real agent loop drives it as it drives a model: turns end on
the protocol's stop tags, searches go through the real client, the same seeds give the same trajectories
in every mode, and the busy intervals it logs are what the table reads. The heavy test runs the benchmark
end to end at a tiny shape (real Ray worker groups, sync and stream).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from benchmarks.pipeline import busy_share
from benchmarks.pipeline_sim import SimulatedEngine, SimulatedSearchBackend
from benchmarks.service_model import SETTINGS_ENV, ServiceModel, Settings, read_settings, write_settings
from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop
from rlinf_search.data.io_struct import QARecord, SamplingParams
from rlinf_search.tools.search import SearchClient, SearchToolConfig

ROOT = Path(__file__).resolve().parents[1]
FAST = ServiceModel(time_scale=1000.0)  # a simulated minute in 60 ms


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    settings = Settings(model=FAST, trace_dir=str(tmp_path))
    monkeypatch.setenv(SETTINGS_ENV, str(write_settings(tmp_path / "settings.json", settings)))
    return settings


def _records(n: int) -> list[QARecord]:
    return [QARecord(uid=f"q{i}", prompt=[{"role": "user", "content": f"Question {i}: who?"}],
                     golden_answers=["x"], data_source="synth") for i in range(n)]


def _rollout(engine, settings, records, samples, seed=7):
    config = AgentLoopConfig(max_turns=4, max_tokens_per_turn=500, max_obs_tokens=500, max_passage_tokens=150,
                             max_response_tokens=4096, topk=3, sampling=SamplingParams())

    async def run():
        tool = SearchClient(SearchToolConfig(backend="local"), SimulatedSearchBackend(settings))
        loop = SearchR1AgentLoop(engine, tool, engine.tokenizer, config)
        try:
            return await loop.run_batch(records, samples, seed=seed)
        finally:
            await tool.aclose()

    return asyncio.run(run())


def test_settings_round_trip_through_the_environment(settings):
    assert read_settings() == settings


def test_the_agent_loop_drives_the_engine_and_the_retriever_as_it_drives_a_model(settings, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = SimulatedEngine(tokenizer, settings, seed=0)
    trajectories = _rollout(engine, settings, _records(6), samples=4)
    assert len(trajectories) == 24
    searches = [t.num_searches for t in trajectories]
    assert max(searches) <= 4 and sum(searches) / len(searches) > 0.5  # the model's 0.9 first-turn chance
    for traj in trajectories:
        assert traj.finish_reason in {"answer", "max_turns", "max_response_tokens"}
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.rollout_logprobs)
        for span in traj.spans:  # model turns train, observations never do
            assert set(traj.response_mask[span.start:span.end]) == {1 if span.kind == "model" else 0}
        assert traj.num_searches == sum(span.kind == "information" for span in traj.spans)
    # The same seed samples the same trajectories on a fresh engine, however requests were batched.
    again = _rollout(SimulatedEngine(tokenizer, settings, seed=1), settings, _records(6), samples=4)
    assert [t.response_ids for t in again] == [t.response_ids for t in trajectories]
    # Every engine step and retrieval left a busy interval, in its own file.
    rows = [json.loads(line) for path in Path(settings.trace_dir).glob("*.jsonl") for line in path.read_text().splitlines()]
    assert {row["group"] for row in rows} == {"rollout", "search"}
    assert all(row["end"] >= row["start"] for row in rows)


def test_a_turn_cut_at_its_limit_has_no_action(settings, tiny_model_dir):
    engine = SimulatedEngine(AutoTokenizer.from_pretrained(tiny_model_dir), settings, seed=0)
    prompt = engine._encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    outcomes = {engine._plan(prompt, SamplingParams(max_new_tokens=120, seed=s))[1] for s in range(200)}
    assert outcomes == {"length", "stop"}
    ids, finish, stop = engine._plan(prompt, SamplingParams(max_new_tokens=3, seed=0))
    assert (len(ids), finish, stop) == (3, "length", None)


def test_decode_steps_cost_more_with_more_context_and_batch():
    model = ServiceModel()
    assert model.decode_step_s(1, 1000) < model.decode_step_s(1, 100_000) < model.decode_step_s(256, 100_000) * 1.01
    # A full batch decodes far more tokens a second than one sequence: the reason engines batch.
    assert 256 / model.decode_step_s(256, 256 * 1500) > 20 / model.decode_step_s(1, 1500)


def test_busy_share_counts_overlapping_intervals_once_per_process():
    rows = [{"pid": 1, "start": 0.0, "end": 4.0}, {"pid": 1, "start": 2.0, "end": 6.0},
            {"pid": 2, "start": 8.0, "end": 12.0}]
    assert busy_share(rows, 0.0, 10.0) == pytest.approx((0.6 + 0.2) / 2)


@pytest.mark.heavy
def test_the_benchmark_runs_through_the_real_runtime(tmp_path):
    out = tmp_path / "bench"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/pipeline.py"), "--devices", "2", "--rollout-devices", "1",
                    "--prompts", "4", "--group-size", "2", "--steps", "2", "--set", "time_scale=20", "--out", str(out),
                    "--modes", "lockstep,sync,async", "--lockstep-turns", "4"],  # overlap and stream: async's placement
                   check=True, cwd=ROOT, timeout=900)
    report = json.loads((out / "results.json").read_text())
    results = report["results"]
    assert set(results) == {"lockstep-t4", "lockstep-t4-nostop", "lockstep-fit", "sync", "async-k1-1+1"}
    assert report["best"] == {"async": "async-k1-1+1"} and results["lockstep-fit"]["fitted"]
    assert report["lockstep_range_s"][0] <= results["lockstep-t4-nostop"]["step_s"] <= report["lockstep_range_s"][1]
    assert 0 < report["ideal_step_s"] < results["sync"]["step_s"], "the packed step is shorter than any real one"
    for name, result in results.items():
        assert result["steps"] == 1 and result["step_s"] > 0
        rows = [json.loads(line) for line in (out / name / "logs" / "metrics.jsonl").read_text().splitlines()]
        assert [row["rollout/trajectories"] for row in rows] == [8.0, 8.0]
        trace = [json.loads(line) for path in (out / f"trace-{name}").glob("*.jsonl")
                 for line in path.read_text().splitlines()]
        assert {row["group"] for row in trace} == {"rollout", "actor", "search"}
        # Two optimizer steps (mini-batches) a step on each actor rank, two steps; old log-probs recomputed.
        assert max(row["optimizer_step"] for row in trace if row["what"] == "train") == 4
        assert any(row["what"] == "logprobs" for row in trace)
    assert results["async-k1-1+1"]["mean_lag"] > 0 and results["sync"]["mean_lag"] == 0
    # Every weight sync streamed the modelled 23 buckets into each engine.
    syncs = [json.loads(line) for path in (out / "trace-async-k1-1+1").glob("rollout-*.jsonl")
             for line in path.read_text().splitlines()]
    assert {row["buckets"] for row in syncs if row["what"] == "weight_sync"} == {23}
    # Lockstep: one batched retrieval per turn for every rank, and the same trajectories sync samples.
    lockstep = [json.loads(line) for path in (out / "trace-lockstep-t4").glob("search-*.jsonl")
                for line in path.read_text().splitlines()]
    assert len({row["pid"] for row in lockstep}) == 1 and all(row["queries"] >= 1 for row in lockstep)
    batches = {name: [json.loads(line) for line in (out / name / "logs" / "batches.jsonl").read_text().splitlines()]
               for name in ("lockstep-t4", "sync")}
    assert batches["lockstep-t4"] == batches["sync"], "the same seeds sample the same turns in either schedule"
    assert (out / "timeline.png").stat().st_size > 10_000


def test_an_abort_keeps_the_tokens_and_the_continuation_is_the_same_turn_prefilled_again(settings, tiny_model_dir):
    slow = Settings(model=ServiceModel(time_scale=2.0), trace_dir=settings.trace_dir)  # about 3.5 ms a token
    engine = SimulatedEngine(AutoTokenizer.from_pretrained(tiny_model_dir), slow, seed=0)
    prompt = engine._encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")

    def plan(seed):
        return engine._plan(prompt, SamplingParams(max_new_tokens=500, seed=seed))

    # A turn of 100 tokens or more that ends in its action: about 0.35 s, the abort lands inside it.
    sampling = SamplingParams(max_new_tokens=500, seed=next(s for s in range(200) if plan(s)[1] == "stop"
                                                            and len(plan(s)[0]) >= 100))
    planned, finish, stop = engine._plan(prompt, sampling)

    async def scenario():
        task = asyncio.create_task(engine.generate(prompt, sampling))
        await asyncio.sleep(0.05)
        engine.abort_all()
        return await task

    first = asyncio.run(scenario())
    assert first.finish_reason == "abort" and 0 < len(first.output_ids) < len(planned)
    assert first.output_ids == planned[: len(first.output_ids)]
    rest = asyncio.run(engine.generate(prompt + first.output_ids, sampling))
    assert first.output_ids + rest.output_ids == planned and (rest.finish_reason, rest.stop_string) == (finish, stop)
    # An idle engine ignores an abort: the next request runs whole.
    engine.abort_all()
    again = asyncio.run(engine.generate(prompt, sampling))
    assert again.output_ids == planned


def test_a_load_resets_the_prefix_cache_and_a_modelled_sync_is_23_buckets(settings, tiny_model_dir):
    from benchmarks.pipeline_sim import SIM_BUCKET_BYTES, SimulatedTrainer
    from rlinf_search.scheduler.weight_buckets import plan_buckets

    engine = SimulatedEngine(AutoTokenizer.from_pretrained(tiny_model_dir), settings, seed=0)
    prompt = engine._encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    turn = engine._encode(" the the <search> q1 </search>")
    engine._cached[tuple(prompt + turn)] = engine._epoch
    second = prompt + turn + engine._encode(" <information> doc </information>")
    assert engine._prefill_tokens(second) == len(second) - len(prompt) - len(turn), "the first turn is cached"
    state = SimulatedTrainer.rollout_state_dict(SimpleTrainer())
    plan = plan_buckets(state, SIM_BUCKET_BYTES, version=1)
    assert len(plan.buckets) == FAST.weight_buckets == 23
    taken = []

    def buckets():
        for index in range(len(plan.buckets)):
            taken.append(index)
            yield {}

    engine.update_weights(buckets())
    assert taken == list(range(23))
    assert engine._prefill_tokens(second) == len(second), "new weights: the cache was reset, all of it again"


class SimpleTrainer:
    model = FAST


def test_each_configuration_is_averaged_over_its_seeds_and_lockstep_runs_as_a_range():
    from benchmarks.pipeline import runs
    from benchmarks.pipeline_report import lockstep_range, mean_over_seeds

    specs = runs(["lockstep", "sync", "async"], [2, 3], 8, max_turns=4, staleness=[1, 2, 4], lockstep_turns=[2, 4])
    names = [spec.name for spec in specs]
    assert names == ["lockstep-t2", "lockstep-t2-nostop", "lockstep-t4", "lockstep-t4-nostop", "lockstep-fit", "sync",
                     "async-k1-2+6", "async-k2-2+6", "async-k4-2+6", "async-k1-3+5", "async-k2-3+5", "async-k4-3+5"]
    by_name = {spec.name: spec for spec in specs}
    assert by_name["lockstep-t2"].max_turns == 2 and dict(by_name["lockstep-t2-nostop"].model_changes)[
        "tokens_after_action"] > 0
    assert by_name["lockstep-fit"].fitted and "decode_step_overhead_s" not in dict(by_name["lockstep-t4"].model_changes)
    merged = mean_over_seeds([{"step_s": 10.0, "mean_lag": 1.0, "window": [0, 1]},
                              {"step_s": 14.0, "mean_lag": 2.0, "window": [5, 6]}])
    assert merged["step_s"] == 12.0 and merged["mean_lag"] == 1.5 and merged["window"] == [0, 1]
    assert merged["step_s_sd"] == pytest.approx(2.8284, abs=1e-3) and merged["seed_step_s"] == [10.0, 14.0]
    results = {"lockstep-t2": {"mode": "lockstep", "fitted": False, "step_s": 90.0},
               "lockstep-fit": {"mode": "lockstep", "fitted": True, "step_s": 200.0},
               "lockstep-t4-nostop": {"mode": "lockstep", "fitted": False, "step_s": 150.0}}
    assert lockstep_range(results) == (90.0, 150.0), "the fitted row is never the range"


def test_a_finished_run_is_reused_only_under_the_same_settings(tmp_path):
    from argparse import Namespace

    from benchmarks.pipeline import RunSpec, finished_run, run_key
    from benchmarks.service_model import ServiceModel

    args = Namespace(devices=8, prompts=512, group_size=5, minibatches=2, steps=8, agent_loop_workers=0)
    spec = RunSpec("async", "async-k2-2+6", 2, 4, max_staleness=2, model_changes=(("decode_step_overhead_s", 0.02),))
    key = run_key(spec, ServiceModel(), args, seed=1)
    assert finished_run(tmp_path, "async-k2-2+6-s1", key) is None, "nothing ran yet"
    (tmp_path / "async-k2-2+6-s1.summary.json").write_text(json.dumps({"key": key, "summary": {"step_s": 50.0}}))
    assert finished_run(tmp_path, "async-k2-2+6-s1", key) == {"step_s": 50.0}
    args.steps = 3
    assert finished_run(tmp_path, "async-k2-2+6-s1", run_key(spec, ServiceModel(), args, seed=1)) is None
    slower = dataclasses.replace(ServiceModel(), search_base_s=1.0)
    args.steps = 8
    assert finished_run(tmp_path, "async-k2-2+6-s1", run_key(spec, slower, args, seed=1)) is None

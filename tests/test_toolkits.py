"""Toolkits: the tiny model maker and the synthetic task generator."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
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

    from rlinf_search.workers.actor.memory_plan import plan_actor_memory
    from toolkits.model_shapes import QWEN25_SHAPES, qwen_config

    for shape in QWEN25_SHAPES:
        config = qwen_config(shape)
        with torch.device("meta"):
            params = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
        assert plan_actor_memory(config, ranks=1, mbs_tokens=1).state == 16 * params, shape
    plan = plan_actor_memory(qwen_config("qwen2.5-3b"), ranks=8, mbs_tokens=8192, reference=True)
    assert 13.5 < plan.total / 2 ** 30 < 14.0  # docs/recipes.md: "about 14 GiB"


def test_machine_info_names_the_cpu_the_kernels_and_the_releases(tmp_path):
    """Every demo run records what it ran on: the vector extensions read off /proc/cpuinfo, the kernel set
    PyTorch chose (ATEN_CPU_CAPABILITY moves it), and the releases of the libraries that change the numbers."""
    import os
    import subprocess
    import sys

    from toolkits.machine_info import cpu_flags

    text = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n"
            "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2\n")
    assert cpu_flags(text) == ("AMD EPYC 7B13", ["avx2", "avx512bw", "avx512f"])
    assert cpu_flags("flags : sse2 avx") == ("unknown", [])
    out = tmp_path / "machine.json"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    done = subprocess.run([sys.executable, "-m", "toolkits.machine_info", "--out", str(out)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    info = json.loads(out.read_text())
    assert info["torch_cpu_capability"] == "DEFAULT" and info["aten_cpu_capability_env"] == "default"
    assert info["releases"]["torch"] and info["releases"]["transformers"]
    assert done.stdout.strip() == info["summary"] and "torch kernels: DEFAULT" in info["summary"]


def test_demo_seeds_table_reads_each_run(tmp_path):
    """scripts/demo_seeds.sh's table: a row per run with its kernels, EM, the probes at the end of the skill and
    mix stages and minutes per stage, a failed run marked as failed, and the machine below."""
    import subprocess
    import sys

    done_run, failed_run = tmp_path / "run1_seed0_native", tmp_path / "run2_seed0_avx2"
    for run, capability in ((done_run, "AVX512"), (failed_run, "AVX2")):
        (run / "model" / "sft").mkdir(parents=True)
        (run / "machine.json").write_text(json.dumps({"torch_cpu_capability": capability,
                                                      "summary": f"a CPU; torch kernels: {capability}"}))
        (run / "seconds").write_text("600")
        reading = {"query_copy": 0.9, "answer_copy": 0.95, "search_mean": 0.2, "search_greedy": 0.0}
        stages = [{"name": "induction", "steps": 300, "seconds": 30, "readings": []},
                  {"name": "reading", "steps": 300, "seconds": 60, "readings": []},
                  {"name": "skill", "steps": 700, "seconds": 240, "readings": [{"step": 700, **reading}]},
                  {"name": "mix", "steps": 100, "seconds": 30, "readings": [{"step": 100, **reading}]}]
        (run / "model" / "sft" / "sft_losses.json").write_text(json.dumps({"stages": stages}))
        (run / "step_seconds.tsv").write_text("warm_start\t340\ngrpo\t180\n")
    scores = {"em": 0.05, "searches": 0.0}
    (done_run / "eval_results.json").write_text(json.dumps({"warm_start": scores,
                                                            "after_rl": {"em": 0.45, "searches": 1.3}}))
    done = subprocess.run([sys.executable, "examples/searchr1/demo_seeds_table.py", str(done_run), str(failed_run)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2] == ("| run1_seed0_native | 0 | AVX512 | 0.050 | 0.450 | +0.400 | 0.00 -> 1.30 | 0.90 / 0.95 (700) | "
                        "0.20 / 0.95 | 0.5 + 1.0 + 4.0 + 0.5, 3.0, 10.0 |")
    assert lines[3].startswith("| run2_seed0_avx2 | 0 | AVX2 | failed")
    assert "Machine: a CPU; torch kernels: AVX512" in done.stdout and "torch kernels: AVX2" in done.stdout


@pytest.mark.parametrize("backend, ranks, gib, refused", [
    ("fsdp", 8, 80, False),       # the FSDP recipe's settings on 8 x 80 GB
    ("fsdp", 1, 80, False),       # one H200-class GPU ran it at 51.5 GiB (docs/history/benchmarks.md section 7)
    ("fsdp", 1, 24, True),
    ("ddp", 8, 40, True),         # a whole fp32 copy with AdamW on every rank: 16 B a parameter
    ("megatron", 1, 48, True),    # the Megatron plan at one rank: about 60 GiB
    ("megatron", 8, 48, False),
])
def test_an_actor_update_that_cannot_fit_its_gpu_is_refused_in_one_line(tmp_path, backend, ranks, gib, refused):
    """The check an actor rank runs on a GPU before it loads weights, for Qwen2.5-3B's real config at the 3B
    recipes' micro-batch (8,192 tokens, KL on)."""
    from rlinf_search.workers.actor.config import ActorConfig, PolicyLossConfig
    from rlinf_search.workers.actor.megatron.config import MegatronConfig
    from rlinf_search.workers.actor.memory_plan import plan_exceeds_device
    from toolkits.model_shapes import qwen_config

    qwen_config("qwen2.5-3b").save_pretrained(tmp_path)
    config = ActorConfig(model_path=str(tmp_path), training_backend=backend, max_tokens_per_mbs=8192,
                         loss=PolicyLossConfig(kl_beta=0.001),
                         megatron=MegatronConfig() if backend == "megatron" else None)
    problem = plan_exceeds_device(config, ranks=ranks, device_bytes=gib * 1024 ** 3)
    assert (problem is not None) == refused, problem
    if refused:
        assert problem.startswith("actor memory plan: one update needs about") and "\n" not in problem
        assert f"this GPU has {gib:.1f} GiB" in problem and "runner.max_tokens_per_mbs" in problem
    # Nothing to plan for without a micro-batch budget.
    assert plan_exceeds_device(replace(config, max_tokens_per_mbs=None), ranks=ranks, device_bytes=1) is None


def test_retriever_agreement_compares_top_passages_on_the_policys_own_queries(tmp_path, capsys):
    """Two real BM25 indexes of one synthetic corpus (built by the index command) agree with themselves: every
    query's top passage is the same, and a name's own page comes first for a query that is a name in the corpus."""
    from rlinf_search.retrieval.build_index import main as build_index_main
    from toolkits.retriever_agreement import main as agreement

    paths = write_task(tmp_path / "data", SynthSpec(people=20, seed=5))
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(tmp_path / "index"),
                             "--retriever", "bm25"]) == 0
    assert paths["corpus"] == tmp_path / "data" / "corpus.jsonl"  # where a demo folder keeps it
    capsys.readouterr()
    corpus = CorpusStore(paths["corpus"])
    name = corpus[0].title
    rollouts = tmp_path / "run" / "rollouts"
    rollouts.mkdir(parents=True)
    (rollouts / "step_1.jsonl").write_text(json.dumps({"queries": [name, "zzqx unknown"]}) + "\n")
    (rollouts / "val_step_1.jsonl").write_text(json.dumps({"queries": [name]}) + "\n")  # not the policy's training
    assert agreement(["--base", str(tmp_path), "--runs", str(tmp_path / "r*"), "--retrievers", "bm25,bm25"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 searches (2 distinct)")
    assert "| bm25 | 0.500 | 0.500 |" in out  # the unknown words find nothing; the name finds its page
    assert "| bm25 / bm25 | 1.000 |" in out
    assert agreement(["--base", str(tmp_path), "--runs", str(tmp_path / "none")]) == 1

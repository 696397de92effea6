"""A whole GRPO step in one process, without Ray: HF engine rollout, old log-probs, FSDP2 update, weight sync.

    python benchmarks/grpo_step.py                                  # Qwen2.5-0.5B's shape on a CUDA GPU, bf16
    python benchmarks/grpo_step.py --shape qwen2.5-3b --prompts 16
    python benchmarks/grpo_step.py --model-dir DIR --device cpu     # any HF model directory, on CPU (the test)

The GPU machine this project borrows has neither Ray nor vLLM, so the runner's worker groups cannot start there;
this drives the same components a collocated step runs, one after the other, in one process: the HF generation
engine the rollout workers run (``workers/rollout/hf_engine.py``) samples ``--group`` answers to each of
``--prompts`` HotpotQA questions; the trainer the actor workers build (``FSDPPolicyTrainer``: FSDP2 at world size 1,
bf16 compute over fp32 master weights, packed rows, gradient checkpointing) scores the old log-probs and runs the
PPO update on GRPO advantages; the weights go back to the engine as the bucket protocol's buckets
(``scheduler/weight_buckets.py``), packed on the device from the trainer's on-device gather and copied into the
engine's parameters, device to device (one process: a CUDA IPC handle cannot be opened by the process that made it;
``benchmarks/ipc_sync.py`` runs that transport between two).

The reward is a stand-in, named so: random weights answer no question, so exact match would give every sample 0 and
GRPO nothing to learn from. Each sample scores the share of its tokens with an even id, which differs within every
group, so the advantages and the update are real. Printed: each stage's seconds, generated tokens a second, the
update's metrics, and whether the engine holds exactly the trainer's weights after the sync. Untested on GPU until
``scripts/gpu_check.sh`` (step ``grpo_step``) has run there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
QUESTIONS = ROOT / "tests" / "data" / "hotpotqa_100" / "test.jsonl"


def even_token_share(output_ids: list[int]) -> float:
    """The stand-in reward: the share of a sample's tokens whose id is even."""
    return sum(1 for token in output_ids if token % 2 == 0) / max(len(output_ids), 1)


def rollout(engine, prompts: list[list[int]], group: int, max_new_tokens: int):
    """``group`` sampled answers to every prompt, in prompt order: (prompt index, prompt ids, output)."""
    from rlinf_search.data.io_struct import SamplingParams

    async def run():
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
        jobs = [(i, prompt) for i, prompt in enumerate(prompts) for _ in range(group)]
        outputs = await asyncio.gather(*(engine.generate(prompt, sampling) for _, prompt in jobs))
        await engine.aclose()
        return [(i, prompt, out) for (i, prompt), out in zip(jobs, outputs)]

    return asyncio.run(run())


def device_buckets(state: dict, bucket_bytes: int, device):
    """``state`` as the bucket protocol sends it (tied weights once), each bucket packed on ``device``."""
    from rlinf_search.scheduler.weight_buckets import pack_bucket, plan_buckets, unpack_bucket

    plan = plan_buckets(state, bucket_bytes, version=1)
    for slots, size in zip(plan.buckets, plan.sizes):
        yield unpack_bucket(pack_bucket(state, slots, size, device=device), slots, plan.aliases)


def grpo_step(model_dir: str, *, device: str, prompts: int, group: int, max_new_tokens: int, mbs_tokens: int,
              bucket_bytes: int) -> dict:
    """One step; its timings and results by name."""
    import torch
    from transformers import AutoTokenizer

    from rlinf_search.algorithms import compute_advantages
    from rlinf_search.data.batch import collate_trajectories
    from rlinf_search.data.io_struct import Trajectory
    from rlinf_search.workers.actor.config import ActorConfig, OptimConfig
    from rlinf_search.workers.actor.logprobs import place_rows
    from rlinf_search.workers.actor.policy_trainer import FSDPPolicyTrainer
    from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine

    cuda = device == "cuda"
    dtype = "bfloat16" if cuda else "float32"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()[:prompts]]
    prompt_ids = [tokenizer.encode(f"Question: {q}\nAnswer:") for q in questions]
    timings: dict[str, float] = {}

    def timed(name, work):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = work()
        if cuda:
            torch.cuda.synchronize()
        timings[name] = time.perf_counter() - started
        return out

    engine = HFGenerationEngine(HFEngineConfig(model_dir, device=device, dtype=dtype, seed=0))
    trainer = FSDPPolicyTrainer(ActorConfig(model_path=model_dir, dtype=dtype, gradient_checkpointing=True,
                                            max_tokens_per_mbs=mbs_tokens, shuffle_rollout=False,
                                            optim=OptimConfig(lr=1e-5, total_steps=10)))
    samples = timed("rollout", lambda: rollout(engine, prompt_ids, group, max_new_tokens))
    rewards = [even_token_share(out.output_ids) for _, _, out in samples]
    trajectories = [Trajectory(uid=f"q{i}", prompt_ids=prompt, response_ids=out.output_ids,
                               response_mask=[1] * len(out.output_ids), rollout_logprobs=out.logprobs)
                    for i, prompt, out in samples]
    batch = collate_trajectories(trajectories, rewards, pad_id=engine.pad_id)
    batch.old_logprobs = timed("old log-probs", lambda: place_rows(tuple(batch.response_mask.shape),
                                                                   [trainer.compute_logprobs(batch)]))
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    metrics = timed("update", lambda: trainer.train_on_batch(batch))
    engine_dtype = next(engine.model.parameters()).dtype

    def sync():
        state = trainer.rollout_state_dict(engine_dtype, on_device=True)
        engine.update_weights(device_buckets(state, bucket_bytes, trainer.device))
        return state

    before = {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}
    sent = timed("sync", sync)
    held = engine.model.state_dict()
    moved = any(not torch.equal(before[name], held[name]) for name in held)
    exact = set(held) <= set(sent) and all(torch.equal(held[name], sent[name].to(held[name].device))
                                           for name in held)
    generated = sum(len(out.output_ids) for _, _, out in samples)
    return {"timings": timings, "metrics": metrics, "exact": exact, "moved": moved, "generated": generated,
            "reward_mean": sum(rewards) / len(rewards), "weight_version": engine.weight_version,
            "rows": len(batch), "tokens": int(batch.attention_mask.sum())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--model-dir", default=None, help="a HF model directory to use instead of a random shape")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (GRPO's group)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--mbs-tokens", type=int, default=8192, help="runner.max_tokens_per_mbs")
    parser.add_argument("--bucket-mib", type=int, default=256)
    args = parser.parse_args(argv)
    if args.group < 2:
        parser.error("--group must be at least 2: GRPO compares the samples of a prompt")

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("grpo_step: no CUDA device here; run it on a GPU machine, or with --device cpu")
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir
        if model_dir is None:
            from toolkits.make_tiny_model import train_tokenizer
            from toolkits.model_shapes import random_model

            corpus = ROOT / "tests" / "data" / "hotpotqa_100" / "corpus.jsonl"
            train_tokenizer(iter(corpus.read_text().splitlines()), 2000).save_pretrained(scratch)
            random_model(args.shape, layers=args.layers, dtype=torch.bfloat16).save_pretrained(scratch)
            model_dir = scratch
        out = grpo_step(model_dir, device=args.device, prompts=args.prompts, group=args.group,
                        max_new_tokens=args.max_new_tokens, mbs_tokens=args.mbs_tokens,
                        bucket_bytes=args.bucket_mib * 2**20)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    model = args.model_dir or f"{args.shape}{f' ({args.layers} layers)' if args.layers else ''}"
    print(f"{device}, torch {torch.__version__}; {model}; {args.prompts} prompts x {args.group} samples, "
          f"{out['rows']} rows, {out['tokens']} tokens")
    print(f"{'stage':<16}{'seconds':>9}")
    for stage, seconds in out["timings"].items():
        print(f"{stage:<16}{seconds:>9.2f}")
    print(f"{'step':<16}{sum(out['timings'].values()):>9.2f}")
    print(f"generated {out['generated']} tokens ({out['generated'] / out['timings']['rollout']:.0f}/s); stand-in "
          f"reward mean {out['reward_mean']:.3f}; grad_norm {out['metrics']['actor/grad_norm']:.3g}, pg_loss "
          f"{out['metrics']['actor/pg_loss']:.3g}; engine holds the trainer's weights exactly: {out['exact']} "
          f"(weight version {out['weight_version']}; changed by the step: {out['moved']})")
    return 0 if out["exact"] and out["moved"] and out["weight_version"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())

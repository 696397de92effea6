"""One GPU, the actor's PPO update on a Qwen2.5-3B-shaped model: peak memory, tokens/s and MFU.

    python benchmarks/gpu_actor_step.py                      # qwen2.5-3b shape, 8,192 tokens per micro-batch
    python benchmarks/gpu_actor_step.py --shape qwen2.5-0.5b --updates 3 --mbs-tokens 4096
    python benchmarks/gpu_actor_step.py --backend megatron  # bf16 GPTModel, distributed optimizer, full recompute
    python benchmarks/gpu_actor_step.py --compile-layers     # a lever on (each is a flag and a column)

It needs only torch, transformers and this package (no vLLM, no Ray, no network), so it runs on a bare
GPU machine. The model is Qwen2.5's published shape with random weights made here
(``toolkits.model_shapes``), trained by the same trainer the actor workers build: FSDP2 at world size 1
(``actor.training_backend: fsdp``), bf16 compute over fp32 master weights, gradient checkpointing,
packed rows and chunked log-probs, as in ``examples/searchr1/config/qwen2.5-3b-tool-fsdp-1node.yaml``;
or (``--backend megatron``) megatron-core at tensor parallel 1: bf16 parameters, fp32 gradient buffer,
distributed optimizer, full recompute of every layer, padded rows, as in ``qwen2.5-3b-tool-1node.yaml``.

Levers, each a flag and a column, so a run with and a run without it sit side by side in one table:
``--compile-layers`` (``actor.model.compile_layers``: each decoder layer through ``torch.compile``; fsdp),
``--core-attention sdpa`` (``actor.megatron.core_attention``: torch's fused attention in place of
megatron-core's local one), ``--unfused-adam`` (torch's Adam back on its ``foreach`` path: the fused kernel is the
default on every backend now). The weight gather a sync needs is timed apart from the update (``gather s``):
Megatron's trainer gathers its shards to the host after every update, which an earlier version of this benchmark
timed as part of the update.

Printed: the peak of ``torch.cuda.max_memory_allocated`` over the timed updates beside
``toolkits.memory_plan``'s plan for one rank (which holds for checkpointing on), training tokens per
second (every token of a row goes through forward and backward), model FLOPs utilisation and hardware FLOPs
utilisation over the GPU's dense bf16 peak (``--peak-tflops``; 989 for H100/H200 SXM). The FLOPs are
``toolkits/update_flops.py``'s count, printed beside the result: the LM head charged to the scored tokens only,
recomputation (and Megatron's head on unscored positions) in HFU, not in MFU. Results and commands:
docs/history/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 512
"""The prompt of every random row."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-3b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--row-tokens", type=int, default=4096, help="longest row (prompt + response)")
    parser.add_argument("--mbs-tokens", type=int, default=8192, help="runner.max_tokens_per_mbs")
    parser.add_argument("--rows", type=int, default=16, help="rows per update (one mini-batch)")
    parser.add_argument("--updates", type=int, default=3, help="timed updates, after one warm-up update")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak")
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--backend", default="fsdp", choices=["fsdp", "megatron"])
    parser.add_argument("--compile-layers", action="store_true", help="actor.model.compile_layers (fsdp)")
    parser.add_argument("--core-attention", default="local", choices=["local", "sdpa"],
                        help="actor.megatron.core_attention (megatron)")
    parser.add_argument("--unfused-adam", action="store_true", help="torch's Adam on its foreach path, not fused")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="run the same steps on CPU to check the script (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.row_tokens // 2 <= PROMPT_TOKENS:
        parser.error(f"--row-tokens must be at least {2 * PROMPT_TOKENS + 2}: rows are a {PROMPT_TOKENS}-token prompt "
                     "and a response, from half --row-tokens long to all of it")
    if args.compile_layers and args.backend != "fsdp":
        parser.error("--compile-layers is a lever of the fsdp backend (actor.model.compile_layers)")
    if args.core_attention != "local" and args.backend != "megatron":
        parser.error("--core-attention is a lever of the megatron backend (actor.megatron.core_attention)")

    import torch

    from rlinf_search.workers.actor.backends import build_trainer
    from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
    from rlinf_search.workers.actor.memory_plan import plan_actor_memory
    from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
    from toolkits.model_shapes import qwen_config, random_model, random_rollout_batch
    from toolkits.update_flops import FORMULA, batch_flops, scored_tokens

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print("gpu_actor_step: no CUDA device here; run it on a GPU machine (docs/history/benchmarks.md)")
        return 2
    shape = qwen_config(args.shape, layers=args.layers)
    with tempfile.TemporaryDirectory() as model_dir:
        started = time.perf_counter()
        model = random_model(args.shape, layers=args.layers, dtype=torch.bfloat16)
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(model_dir)  # bf16 on disk; the trainer loads fp32 master weights
        del model
        if args.cpu_smoke and args.backend == "megatron":  # after the HF model: its loading expects plain torch
            from tests.megatron_ranks import cpu_as_cuda

            cpu_as_cuda()
        print(f"made a random {args.shape} ({shape.num_hidden_layers} layers, {n_params / 1e9:.2f} B parameters) "
              f"in {time.perf_counter() - started:.0f} s", flush=True)
        megatron = None
        if args.backend == "megatron":
            from rlinf_search.workers.actor.megatron.config import MegatronConfig

            megatron = MegatronConfig(recompute_granularity=None if args.no_checkpointing else "full",
                                      recompute_method=None if args.no_checkpointing else "uniform",
                                      recompute_num_layers=None if args.no_checkpointing else 1,
                                      core_attention=args.core_attention)
        fsdp = args.backend == "fsdp"
        config = ActorConfig(model_path=model_dir, training_backend=args.backend, dtype="bfloat16",
                             gradient_checkpointing=fsdp and not args.no_checkpointing, pack_sequences=fsdp,
                             compile_layers=args.compile_layers,
                             logprob_chunk_tokens=1024, max_tokens_per_mbs=args.mbs_tokens, n_minibatches=1,
                             shuffle_rollout=False, optim=OptimConfig(lr=1e-6, total_steps=100),
                             loss=PolicyLossConfig(kl_beta=0.0), megatron=megatron)
        trainer = build_trainer(config)
        if args.unfused_adam:
            set_adam_fused(trainer, False)
    batch = random_rollout_batch(rows=args.rows, row_tokens=args.row_tokens, prompt_tokens=PROMPT_TOKENS)
    tokens = int(batch.attention_mask.sum())
    # PolicyTrainer's update itself: Megatron's override adds the host gather, which is timed apart (gather s).
    update = functools.partial(PolicyTrainer.train_on_batch, trainer)
    update(batch)  # warm-up: optimizer state allocated, kernels chosen (and compiled)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(args.updates):
        metrics = update(batch)
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / args.updates
    peak = torch.cuda.max_memory_allocated() / 1024 ** 3 if cuda else float("nan")
    started = time.perf_counter()
    gather_weights(trainer, torch.bfloat16)
    if cuda:
        torch.cuda.synchronize()
    gather_s = time.perf_counter() - started
    # The Megatron wrapper runs its head on the scored positions, not in checkpointed chunks: no head recompute.
    head_positions = None if fsdp else scored_tokens(batch)
    recompute = "none" if args.no_checkpointing else ("layers" if fsdp else "full")
    flops = batch_flops(shape, batch, recompute=recompute, head_positions=head_positions)
    tokens_per_s = tokens / seconds
    mfu = flops.useful / seconds / (args.peak_tflops * 1e12)
    hfu = flops.executed / seconds / (args.peak_tflops * 1e12)
    plan = plan_actor_memory(shape, ranks=1, mbs_tokens=args.mbs_tokens, backend=args.backend).total / 1024 ** 3
    adam = "foreach" if args.unfused_adam else "fused"
    levers = f"{'on' if args.compile_layers else 'off'}/{args.core_attention}/{adam}"
    print(f"{'device':<28}{'backend':<10}{'shape':<14}{'compile/attn/adam':<20}{'tokens/update':>14}{'mbs tokens':>11}"
          f"{'ckpt':>6}{'peak GiB':>10}{'plan GiB':>10}{'s/update':>10}{'gather s':>10}{'tokens/s':>10}{'MFU':>7}"
          f"{'HFU':>7}")
    device = torch.cuda.get_device_name() if cuda else "cpu (smoke run)"
    print(f"{device:<28}{args.backend:<10}{args.shape:<14}{levers:<20}{tokens:>14}{args.mbs_tokens:>11}"
          f"{'off' if args.no_checkpointing else 'on':>6}{peak:>10.1f}{plan:>10.1f}{seconds:>10.2f}{gather_s:>10.2f}"
          f"{tokens_per_s:>10.0f}{100 * mfu:>6.1f}%{100 * hfu:>6.1f}%")
    print(f"loss finite: {all(map(math.isfinite, metrics.values()))}; grad_norm {metrics['actor/grad_norm']:.3g}; "
          f"rows packed: {getattr(trainer, 'packed', False)} ({config.model_attention if fsdp else 'megatron-core'} "
          f"attention)")
    print(f"TFLOPs per update: layers {flops.layers / 1e12:.1f}, attention {flops.attention / 1e12:.1f}, head "
          f"{flops.head / 1e12:.1f}; recompute {flops.recompute / 1e12:.1f} ({recompute}), unscored head "
          f"{flops.unscored_head / 1e12:.1f}. {FORMULA}")
    return 0


def set_adam_fused(trainer, fused: bool) -> None:
    """The trainer's torch Adam on its fused kernel or its ``foreach`` path (before its first step)."""
    if trainer.config.training_backend == "megatron":
        from rlinf_search.workers.actor.megatron.optimizer import fuse_torch_adam

        fuse_torch_adam(trainer.optimizer, fused)
    else:
        from rlinf_search.workers.actor.policy_trainer import set_adam_kernel

        set_adam_kernel(trainer.optimizer, fused)


def gather_weights(trainer, dtype) -> None:
    """What a weight sync asks of the trainer: Megatron gathers its shards to the host (after every update, inside
    ``train_on_batch``); FSDP gathers them in the sync's dtype."""
    if trainer.config.training_backend == "megatron":
        trainer._refresh_hf_state()
    else:
        trainer.rollout_state_dict(dtype)


if __name__ == "__main__":
    sys.exit(main())

"""What ``actor.offload_*`` gives back: device memory held by one actor rank before, during and after an offload.

    python benchmarks/offload_memory.py --shape qwen2.5-0.5b --backend fsdp       # on a GPU
    python benchmarks/offload_memory.py --shape qwen2.5-0.5b --backend megatron
    python benchmarks/offload_memory.py --shape qwen2.5-0.5b --layers 2 --cpu-smoke   # checks the script on CPU

One rank scores a batch without gradients and trains one PPO update on it (the actor's order), on a
Qwen2.5-shaped model with random weights (``toolkits.model_shapes``), then swaps weights, gradients and
optimizer state out (``workers/offload.py``) and back, as the actor worker does around every rollout when
the engine shares its GPU. Printed:
``torch.cuda.memory_allocated`` at each point and the memory reserved by the caching allocator once away (what
a collocated vLLM can take), the host bytes of the copies, the seconds each way, whether every tensor came
back bitwise, and whether the next update is finite. With ``--cpu-smoke`` the swap is forced on the CPU
(device and host are the same memory there) in fp32, and only the last two columns mean anything.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 1024 ** 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--backend", default="fsdp", choices=["fsdp", "ddp", "megatron"])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--row-tokens", type=int, default=2048)
    parser.add_argument("--cpu-smoke", action="store_true", help="force the swap on CPU to check the script")
    args = parser.parse_args(argv)

    import torch

    from rlinf_search.workers.actor.backends import build_trainer
    from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
    from rlinf_search.workers.offload import CATEGORIES, OffloadConfig, Offloader, local_shard
    from toolkits.model_shapes import random_model, random_rollout_batch

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print("offload_memory: no CUDA device here; run it on a GPU machine, or with --cpu-smoke")
        return 2
    with tempfile.TemporaryDirectory() as model_dir:
        model = random_model(args.shape, layers=args.layers, dtype=torch.bfloat16)
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(model_dir)
        del model
        megatron = None
        if args.backend == "megatron":
            if args.cpu_smoke:  # after the HF model: its loading expects plain torch
                from tests.megatron_ranks import cpu_as_cuda

                cpu_as_cuda()
            from rlinf_search.workers.actor.megatron.config import MegatronConfig

            megatron = MegatronConfig(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        # bf16 on the GPU; fp32 in the smoke run (bf16 matmuls crawl on a CPU without AVX-512 bf16).
        dtype = "float32" if args.cpu_smoke else "bfloat16"
        config = ActorConfig(model_path=model_dir, training_backend=args.backend, dtype=dtype,
                             gradient_checkpointing=args.backend != "megatron", pack_sequences=args.backend != "megatron",
                             logprob_chunk_tokens=1024, max_tokens_per_mbs=8192, n_minibatches=1, shuffle_rollout=False,
                             optim=OptimConfig(lr=1e-6, total_steps=100), loss=PolicyLossConfig(kl_beta=0.0),
                             megatron=megatron)
        trainer = build_trainer(config)
    if args.cpu_smoke:  # the CPU loader memory-maps the checkpoint; on a GPU the allocator owns every weight
        with torch.no_grad():
            for param in trainer.model.parameters():
                if not param.untyped_storage().resizable():
                    param.data = param.data.clone()
    batch = random_rollout_batch(rows=args.rows, row_tokens=args.row_tokens, prompt_tokens=512)
    trainer.compute_logprobs(batch)  # the actor's order: old log-probs, then the update
    trainer.train_on_batch(batch)  # optimizer state allocated, gradients left from the backward

    def allocated() -> float:
        if not cuda:
            return float("nan")
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() / GIB

    def snapshot() -> list:
        listed = trainer.offload_tensors()
        return [local_shard(t).detach().to("cpu", copy=True) for name in CATEGORIES for t in getattr(listed, name)]

    before = snapshot()
    offloader = Offloader(OffloadConfig(weights=True, grads=True, optimizer=True), trainer.offload_tensors,
                          device=trainer.device)
    on_device = allocated()
    started = time.perf_counter()
    offloader.offload(force=args.cpu_smoke)  # the first one pins its host buffers (slow); later ones reuse them
    first_s = time.perf_counter() - started
    offloader.onload()
    started = time.perf_counter()
    offloader.offload(force=args.cpu_smoke)
    offload_s = time.perf_counter() - started
    away = allocated()
    reserved = torch.cuda.memory_reserved() / GIB if cuda else float("nan")
    host_by = {name: sum(h.numel() for _, h in pairs or []) / GIB for name, pairs in offloader._away.items()}
    host = sum(host_by.values())
    started = time.perf_counter()
    offloader.onload()
    onload_s = time.perf_counter() - started
    back = allocated()
    exact = all(torch.equal(a, b) for a, b in zip(before, snapshot(), strict=True))
    metrics = trainer.train_on_batch(batch)
    finite = all(map(math.isfinite, metrics.values()))

    device = torch.cuda.get_device_name() if cuda else "cpu (smoke run)"
    print(f"{'device':<26}{'backend':<10}{'shape':<14}{'params':>8}{'on GiB':>8}{'away GiB':>9}{'reserved':>9}"
          f"{'back GiB':>9}{'host GiB':>9}{'1st out s':>10}{'out s':>7}{'in s':>7}{'exact':>7}{'finite':>7}")
    print(f"{device:<26}{args.backend:<10}{args.shape:<14}{n_params / 1e9:>7.2f}B{on_device:>8.2f}{away:>9.2f}"
          f"{reserved:>9.2f}{back:>9.2f}{host:>9.2f}{first_s:>10.2f}{offload_s:>7.2f}{onload_s:>7.2f}{exact!s:>7}{finite!s:>7}")
    print("host copies: " + ", ".join(f"{name} {gib:.2f} GiB" for name, gib in host_by.items()))
    return 0 if exact and finite else 1


if __name__ == "__main__":
    sys.exit(main())

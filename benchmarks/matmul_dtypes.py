"""The dtype of every matmul in one actor update, forward and backward apart, for each training backend.

    python benchmarks/matmul_dtypes.py                                # fsdp and megatron, Qwen2.5-0.5B shape
    python benchmarks/matmul_dtypes.py --backends megatron --recompute full
    python benchmarks/matmul_dtypes.py --cpu-smoke --layers 2         # check the script on CPU

A recipe that says "bf16" should run its matmuls in bf16 in the backward pass too: bf16 on an H100 is
about 10x the fp32 (TF32 off) rate. One update of the trainer the actor workers build
(``build_trainer``) runs under a dispatch mode that sums the FLOPs of every matrix product and
attention kernel by pass (forward; backward, checkpoint recompute included) and by the dtype of its
inputs. Printed: each backend's FLOP share in bf16 and in fp32 per pass, and beside it an unobserved
update's time and peak GPU memory. It needs torch, transformers, megatron-core for ``megatron`` and
this package (no vLLM, no Ray, no network): ``scripts/gpu_check.sh`` runs it on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmul_flops(func, args) -> float:
    """FLOPs of one aten matrix product or attention call (0 for every other op)."""
    import torch

    aten = torch.ops.aten
    name = func.overloadpacket
    if name in (aten.mm, aten.bmm):
        a, b = args[0], args[1]
        return 2.0 * a.numel() * b.shape[-1]
    if name in (aten.addmm, aten.baddbmm):
        a, b = args[1], args[2]
        return 2.0 * a.numel() * b.shape[-1]
    if "scaled_dot_product" in str(name) or "flash_attention" in str(name):
        q, k = args[0], args[1]  # (batch, heads, query, dim) and (batch, heads, key, dim)
        forward = 4.0 * q.numel() * k.shape[-2]
        return 2 * forward if "backward" in str(name) else forward
    return 0.0


def observed_update(trainer, batch) -> dict[tuple[str, str], float]:
    """One ``train_on_batch`` with every matmul's FLOPs summed by (pass, input dtype)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    flops: dict[tuple[str, str], float] = defaultdict(float)

    class CountMatmuls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counted = matmul_flops(func, args)
            if counted:
                # Inside the autograd engine (backward, and the recompute a checkpoint runs there).
                phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
                dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), None)
                flops[(phase, str(dtype).replace("torch.", ""))] += counted
            return func(*args, **(kwargs or {}))

    with CountMatmuls():
        trainer.train_on_batch(batch)
    return dict(flops)


def pass_flops(flops: dict[tuple[str, str], float], phase: str) -> float:
    """All of one pass's counted FLOPs, whatever their dtype."""
    return sum(v for (p, _), v in flops.items() if p == phase)


def build(backend: str, model_dir: str, args):
    from rlinf_search.workers.actor.backends import build_trainer
    from rlinf_search.workers.actor.config import (
        ActorConfig,
        OptimConfig,
        PolicyLossConfig,
    )

    megatron = None
    if backend == "megatron":
        from rlinf_search.workers.actor.megatron.config import MegatronConfig

        full = args.recompute == "full"
        megatron = MegatronConfig(recompute_granularity=args.recompute,
                                  recompute_method="uniform" if full else None,
                                  recompute_num_layers=1 if full else None)
    config = ActorConfig(model_path=model_dir, training_backend=backend, dtype="bfloat16",
                         gradient_checkpointing=backend != "megatron", pack_sequences=backend == "fsdp", logprob_chunk_tokens=1024,
                         max_tokens_per_mbs=args.mbs_tokens, n_minibatches=1, shuffle_rollout=False,
                         optim=OptimConfig(lr=1e-6, total_steps=100), loss=PolicyLossConfig(kl_beta=0.0),
                         megatron=megatron)
    return build_trainer(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["fsdp", "megatron"])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--row-tokens", type=int, default=2048)
    parser.add_argument("--mbs-tokens", type=int, default=8192)
    parser.add_argument("--recompute", default="full", choices=["full", "selective", "none"],
                        help="megatron's recompute_granularity (the 3B Megatron recipe's is full)")
    parser.add_argument("--cpu-smoke", action="store_true", help="run on CPU to check the script")
    args = parser.parse_args(argv)
    if args.recompute == "none":
        args.recompute = None

    import torch

    from toolkits.model_shapes import random_model, random_rollout_batch

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print("matmul_dtypes: no CUDA device here; run it on a GPU machine (or --cpu-smoke)")
        return 2
    if args.cpu_smoke and "megatron" in args.backends:
        from tests.megatron_ranks import cpu_as_cuda

        cpu_as_cuda()
    batch = random_rollout_batch(rows=args.rows, row_tokens=args.row_tokens, prompt_tokens=256)
    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        random_model(args.shape, layers=args.layers, dtype=torch.bfloat16).save_pretrained(model_dir)
        for backend in args.backends:
            try:
                trainer = build(backend, model_dir, args)
                trainer.train_on_batch(batch)  # warm-up: optimizer state, kernel choice
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                started = time.perf_counter()
                trainer.train_on_batch(batch)
                if cuda:
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else float("nan")
                flops = observed_update(trainer, batch)
            except Exception as error:  # one backend failing must not hide the other's figures
                traceback.print_exc()
                print(f"{backend}: failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
                continue
            finally:
                trainer = None
                if cuda:
                    torch.cuda.empty_cache()
            for phase in ("forward", "backward"):
                total = pass_flops(flops, phase) or float("nan")
                share = {d: v / total for (p, d), v in flops.items() if p == phase}
                rows.append((backend, phase, total / 1e12, share.get("bfloat16", 0.0), share.get("float32", 0.0),
                             seconds, peak))
    device = torch.cuda.get_device_name() if cuda else "cpu (smoke run)"
    print(f"{device}, {args.shape}{f' ({args.layers} layers)' if args.layers else ''}, {args.rows} rows of "
          f"<= {args.row_tokens} tokens, megatron recompute {args.recompute}")
    print(f"{'backend':<10}{'pass':<10}{'TFLOP':>8}{'bf16':>8}{'fp32':>8}{'s/update':>10}{'peak GiB':>10}")
    for backend, phase, tflop, bf16, fp32, seconds, peak in rows:
        print(f"{backend:<10}{phase:<10}{tflop:>8.2f}{100 * bf16:>7.0f}%{100 * fp32:>7.0f}%{seconds:>10.2f}"
              f"{peak:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

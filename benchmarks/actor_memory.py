"""Peak memory per rank of one PPO update of the actor at a real model shape, on this CPU.

    python benchmarks/actor_memory.py                       # Qwen2.5-0.5B's shape (2 of its 24 layers), 2 ranks
    python benchmarks/actor_memory.py --layers 4 --mbs-tokens 2048,8192 --cases fsdp-all,ddp-none
    python benchmarks/actor_memory.py --cases ddp-none,fsdp-none,megatron-none --mbs-tokens 2048   # the state split

Each case spawns the ranks (gloo), builds the trainer the workers build (``workers.actor.backends``) on a
random model of Qwen2.5's published shape (151,936-token vocabulary, tied embeddings, grouped-query
attention), and runs one ``train_on_batch`` with bf16 compute over fp32 master weights on rows of up
to ``--row-tokens`` tokens, ``--mbs-tokens`` per micro-batch. Memory is tracked by PyTorch's own
``MemTracker`` (a dispatch mode that sees every tensor storage the update allocates and frees, on any
device), so the figures are tensor bytes, not allocator or RSS noise:

- ``state``: parameters + gradients + optimizer state held by the rank after the update (exact). Under
  ``megatron`` (megatron-core's DDP and distributed optimizer, run on this CPU the way the tests run it)
  the parameters are bf16 (its DDP parameter buffer), the gradients its fp32 gradient buffer (whole on
  every rank: it is reduce-scattered into, not sharded) and the optimizer state the rank's slice of fp32
  main weights and Adam moments;
- ``peak``: the highest total of live tensor bytes during the update;
- ``plan``: what ``toolkits.memory_plan`` predicts for the peak (FSDP with every saver on);
- ``rest``: peak - state, the activations, logits and temporaries one micro-batch needs; ``rest/1k``
  is that per 1,024 tokens of micro-batch budget (what a memory plan scales).

A case whose estimated peak exceeds this machine's memory is not run (its row says so). The figures are
what docs/recipes.md's memory plan for Qwen2.5-3B is computed from; docs/history/benchmarks.md has the command
and the table.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.workers.actor.memory_plan import plan_actor_memory  # noqa: E402
from toolkits.model_shapes import qwen_config, random_model, random_rollout_batch  # noqa: E402

GIB = 1024 ** 3
VOCAB = 151936  # Qwen2.5's vocabulary, every shape


@dataclass(frozen=True)
class Case:
    """One row of the table: a backend and which memory savers are on."""

    backend: str
    """``ddp``, ``fsdp`` or ``megatron`` (``actor.training_backend``)."""
    checkpointing: bool
    """``actor.model.enable_gradient_checkpointing``; under megatron, full recompute of every layer."""
    chunked: bool
    """Log-probs over 1,024-token LM-head chunks; off = one chunk of the whole micro-batch."""
    packed: bool
    """``actor.model.use_remove_padding`` (not under megatron: its model takes padded rows)."""

    @property
    def name(self) -> str:
        savers = [n for n, on in (("ckpt", self.checkpointing), ("chunk", self.chunked), ("pack", self.packed)) if on]
        return f"{self.backend}-{'+'.join(savers) or 'none'}"


CASES = {case.name: case for case in (
    Case("ddp", False, False, False), Case("fsdp", False, False, False),
    Case("fsdp", True, False, False), Case("fsdp", False, True, False), Case("fsdp", False, False, True),
    Case("fsdp", True, True, True), Case("ddp", True, True, True),
    Case("megatron", False, False, False), Case("megatron", True, True, False))}
CASES["fsdp-all"], CASES["ddp-all"] = CASES["fsdp-ckpt+chunk+pack"], CASES["ddp-ckpt+chunk+pack"]
CASES["megatron-all"] = CASES["megatron-ckpt+chunk"]
DEFAULT_CASES = ["ddp-none", "fsdp-none", "fsdp-ckpt", "fsdp-chunk", "fsdp-pack", "fsdp-all", "ddp-all"]


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storages created while it is active and still alive; keeps the peak.

    It sees the outputs of every aten op (FSDP's all-gathers, autograd's gradients, AdamW's state
    included); a weak-reference finalizer on each new storage subtracts it when it is freed.
    """

    def __init__(self):
        super().__init__()
        self.live, self.peak, self._sizes = 0, 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value.to_local() if hasattr(value, "to_local") else value)
        return out

    def _track(self, tensor) -> None:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._sizes:
            return
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key) -> None:
        self.live -= self._sizes.pop(key, 0)


def _rank_bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _unique_storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (megatron-core's parameters and gradients are views
    of a few flat buffers)."""
    seen = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _megatron_config(case: Case):
    from rlinf_search.workers.actor.megatron.config import MegatronConfig

    if case.checkpointing:
        return MegatronConfig(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return MegatronConfig()


def _state(trainer, case: Case) -> dict:
    """Parameters, gradients and optimizer state this rank holds (bytes)."""
    if case.backend == "megatron":
        from rlinf_search.workers.actor.megatron.optimizer import optimizer_state_bytes

        buffers = trainer.ddp.buffers
        return {"params": _unique_storage_bytes(b.param_data for b in buffers),
                "grads": _unique_storage_bytes(b.grad_data for b in buffers),
                "optimizer": optimizer_state_bytes(trainer.optimizer)}
    params = list(trainer.scorer.parameters())
    return {"params": _rank_bytes(params), "grads": _rank_bytes(p.grad for p in params if p.grad is not None),
            "optimizer": _rank_bytes(v for s in trainer.optimizer.state.values() for k, v in s.items()
                                     if torch.is_tensor(v) and k != "step")}


def _run_rank(rank: int, world_size: int, port: int, case: Case, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist
    from rlinf_search.workers.actor.backends import build_trainer
    from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
    from rlinf_search.workers.actor.policy_trainer import PolicyTrainer

    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.disable_progress_bar()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world_size))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if case.backend == "megatron":
        sys.path.insert(0, str(ROOT))
        from tests.megatron_ranks import cpu_as_cuda

        cpu_as_cuda()  # megatron-core's CUDA-only calls mapped to the CPU, as in the tests
    config = ActorConfig(model_path=args.model_dir, training_backend=case.backend, dtype="bfloat16",
                         gradient_checkpointing=case.checkpointing and case.backend != "megatron",
                         pack_sequences=case.packed, logprob_chunk_tokens=1024 if case.chunked else 1 << 30,
                         max_tokens_per_mbs=args.mbs, n_minibatches=1, shuffle_rollout=False,
                         optim=OptimConfig(lr=1e-6, total_steps=10), loss=PolicyLossConfig(kl_beta=0.0),
                         megatron=_megatron_config(case) if case.backend == "megatron" else None)
    trainer = build_trainer(config)
    # Prompts of 256 tokens (a quarter of the row when rows are shorter than 1,024), responses the rest.
    batch = random_rollout_batch(rows=args.batch_rows, row_tokens=args.row_tokens,
                                 prompt_tokens=min(256, args.row_tokens // 4))
    # What exists before the update: FSDP's and DDP's sharded or whole fp32 parameters; megatron-core's
    # buffers and fp32 main weights (made at start-up). Everything else is allocated in the update.
    before = sum(_state(trainer, case).values())
    tracker = LiveTensorBytes()
    started = time.perf_counter()
    with tracker:
        # The update alone: megatron's trainer then gathers the new weights to rank 0's host for the rollout,
        # a host copy on a GPU machine, left out here.
        PolicyTrainer.train_on_batch(trainer, batch)
    seconds = time.perf_counter() - started
    state = _state(trainer, case)
    peak = before + tracker.peak
    tokens = int(batch.attention_mask.sum())
    result = {**state, "peak": peak, "seconds": seconds, "tokens": tokens}
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _estimated_peak(case: Case, args, params: int) -> float:
    """A rough bound (bytes per rank) to skip cases this machine cannot hold: 16 B a parameter (DDP) or
    16/ranks (FSDP), 2 GiB of gathered layers and activations, and 16 B per logit (bf16 and fp32 copies,
    log-softmax and their gradients) of the micro-batch, or of one chunk."""
    state = {"fsdp": 16 / args.ranks, "ddp": 16, "megatron": 6 + 12 / args.ranks}[case.backend] * params
    logits_tokens = min(args.mbs, 1024) if case.chunked else args.mbs
    return state + 2 * GIB + 16 * logits_tokens * VOCAB


def measure(case: Case, args) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_run_rank, args=(args.ranks, _free_port(), case, args, out), nprocs=args.ranks, join=True)
        ranks = [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(args.ranks)]
    worst = max(ranks, key=lambda r: r["peak"])
    return {**worst, "state": worst["params"] + worst["grads"] + worst["optimizer"],
            "seconds": max(r["seconds"] for r in ranks)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (fewer than the real model's, for time)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--row-tokens", type=int, default=2048, help="longest row (prompt + response)")
    parser.add_argument("--mbs-tokens", default="2048,8192", help="token budgets per micro-batch, comma-separated")
    parser.add_argument("--rows", type=int, default=0, help="rows in the batch (0: per budget, enough to fill "
                                                            "a micro-batch on every rank)")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"some of {', '.join(CASES)}")
    parser.add_argument("--memory-gib", type=float, default=None,
                        help="skip cases estimated above this (default: 80%% of this machine's RAM / ranks)")
    args = parser.parse_args(argv)
    cases = [CASES[name] for name in args.cases.split(",")]
    budgets = [int(b) for b in args.mbs_tokens.split(",")]
    total_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = (args.memory_gib * GIB) if args.memory_gib else 0.8 * total_ram / args.ranks
    with tempfile.TemporaryDirectory() as model_dir:
        model = random_model(args.shape, layers=args.layers)
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(model_dir)
        del model
        shape = qwen_config(args.shape, layers=args.layers)
        print(f"{args.shape} shape, {args.layers} layers, {n_params / 1e6:.1f} M parameters; {args.ranks} ranks "
              f"(gloo, this CPU); rows of {args.row_tokens // 2}..{args.row_tokens} tokens; bf16 compute, "
              f"fp32 master weights and AdamW state; torch {torch.__version__}", flush=True)
        header = (f"{'case':<22}{'mbs tokens':>11}{'params':>9}{'grads':>9}{'optim':>9}{'state':>9}"
                  f"{'rest':>9}{'peak':>9}{'plan':>7}{'rest/1k':>9}{'s/update':>10}   (GiB per rank)")
        print(header)
        print("-" * len(header))
        results = []
        for budget in budgets:
            for case in cases:
                # Enough rows (3/4 of the longest on average) for each rank to fill at least one micro-batch.
                rows = args.rows or args.ranks * max(2, -(-budget * 4 // (3 * args.row_tokens)))
                args.model_dir, args.mbs, args.batch_rows = model_dir, budget, rows
                estimate = _estimated_peak(case, args, n_params)
                if estimate > limit:
                    print(f"{case.name:<22}{budget:>11}   not run: needs about {estimate / GIB:.0f} GiB per rank, "
                          f"over {limit / GIB:.0f} GiB here", flush=True)
                    continue
                r = measure(case, args)
                results.append((case, budget, r))
                # toolkits.memory_plan's rules hold for FSDP with every saver on (what the GPU recipe runs)
                plan = (f"{plan_actor_memory(shape, ranks=args.ranks, mbs_tokens=budget).total / GIB:>7.2f}"
                        if case == CASES["fsdp-all"] else f"{'-':>7}")
                print(f"{case.name:<22}{budget:>11}{r['params'] / GIB:>9.2f}{r['grads'] / GIB:>9.2f}"
                      f"{r['optimizer'] / GIB:>9.2f}{r['state'] / GIB:>9.2f}{(r['peak'] - r['state']) / GIB:>9.2f}"
                      f"{r['peak'] / GIB:>9.2f}{plan}{(r['peak'] - r['state']) / GIB / (budget / 1024):>9.3f}"
                      f"{r['seconds']:>10.1f}", flush=True)
    _print_ratios(results)
    return 0


def _print_ratios(results) -> None:
    """The issue's two targets, as ratios of rows measured in this run."""
    by = {(case.name, budget): r for case, budget, r in results}
    print()
    for budget in sorted({b for _, b, _ in results}):
        ddp, fsdp = by.get(("ddp-none", budget)), by.get(("fsdp-none", budget))
        if ddp and fsdp:
            print(f"mbs {budget}: FSDP state / DDP state = {fsdp['state'] / ddp['state']:.2f}")
        megatron = by.get(("megatron-none", budget)) or by.get(("megatron-ckpt+chunk", budget))
        if ddp and megatron:
            print(f"mbs {budget}: Megatron state / DDP state = {megatron['state'] / ddp['state']:.2f} "
                  f"(its optimizer slice / DDP's AdamW state = {megatron['optimizer'] / ddp['optimizer']:.2f})")
        full = by.get(("fsdp-ckpt+chunk+pack", budget))
        if fsdp and full:
            rest_none, rest_all = fsdp["peak"] - fsdp["state"], full["peak"] - full["state"]
            print(f"mbs {budget}: rest without savers / with checkpointing+chunking+packing = "
                  f"{rest_none / max(rest_all, 1):.1f}x (measured)")
    # Where the case without savers cannot run at the largest budget: a lower bound from its measured
    # row, adding only the logit copies that grow with the micro-batch (bf16 logits, fp32 log-softmax
    # and its gradient: 10 B per token and vocabulary entry).
    budgets = sorted({b for _, b, _ in results})
    none = [(b, by[("fsdp-none", b)]) for b in budgets if ("fsdp-none", b) in by]
    full = by.get(("fsdp-ckpt+chunk+pack", budgets[-1])) if budgets else None
    if none and full and none[-1][0] < budgets[-1]:
        bn, rn = none[-1]
        bound = rn["peak"] - rn["state"] + (budgets[-1] - bn) * VOCAB * 10
        print(f"mbs {budgets[-1]}: fsdp-none not run; its rest is at least {bound / GIB:.1f} GiB (its mbs {bn} "
              f"figure + the larger logits), so the savers cut the rest at least "
              f"{bound / max(full['peak'] - full['state'], 1):.1f}x (estimated, not measured)")

if __name__ == "__main__":
    sys.exit(main())

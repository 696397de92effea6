"""The service model of ``benchmarks/pipeline.py``: how long each piece of work takes on the simulated cluster
(``ServiceModel``), how the simulated components read it (``Settings``, through ``RLINF_PIPELINE_SIM``), and how
they log when they were busy (``Trace``)."""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SETTINGS_ENV = "RLINF_PIPELINE_SIM"
"""Environment variable naming the settings JSON (``write_settings``)."""


@dataclass(frozen=True)
class ServiceModel:
    """How long each piece of work takes on the simulated cluster (seconds are simulated seconds).

    Model: Qwen2.5-3B-Instruct (config.json: 36 layers, 2 key-value heads of 128, 3.09e9 parameters), bf16.
    Device: one H100 SXM per engine or trainer rank (data sheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16).
    The efficiencies and the trajectory and search shapes are assumptions, named as such; docs/history/benchmarks.md
    says where each figure comes from and what the modelled sync step gives beside Search-R1's measured one.
    """

    params: float = 3.09e9
    """Parameters (Qwen2.5-3B)."""
    weight_bytes: float = 6.17e9
    """bf16 weights an engine reads every decode step."""
    kv_bytes_per_token: float = 36 * 2 * 2 * 128 * 2
    """KV cache per context token: layers x (key, value) x KV heads x head dim x 2 bytes = 36,864."""
    hbm_bytes_per_s: float = 3.35e12
    """H100 SXM memory bandwidth."""
    peak_flops: float = 989e12
    """H100 SXM dense bf16."""
    decode_bandwidth_efficiency: float = 0.6
    """Share of the bandwidth a decode step achieves (assumption)."""
    decode_step_overhead_s: float = 0.004
    """Scheduling, sampling and launch time per engine step (assumption; CUDA graphs keep it small)."""
    prefill_mfu: float = 0.4
    """Model FLOP utilisation of prefill and of the compute part of a decode step (assumption)."""
    max_running_requests: int = 256
    """Sequences an engine decodes at once; more wait (vLLM's ``max_num_seqs``, Search-R1's default)."""
    train_mfu: float = 0.35
    """Model FLOP utilisation of the actor's passes (assumption; FSDP and Megatron RL runs report 0.3-0.45)."""
    train_flops_per_token: float = 8.0
    """x parameters per trained token in the update: forward and backward (6) and gradient checkpointing's second
    forward (2), which Search-R1's and RLinf's recipes turn on (``enable_gradient_checkpointing``)."""
    logprob_flops_per_token: float = 4.0
    """x parameters per token of the log-prob passes before the update: old (2) and reference (2) log-probs, one
    call (``SimulatedTrainer.compute_logprobs``; a run that never calls it pays them inside the update)."""
    weight_sync_s: float = 1.5
    """Actor to engines, 6 GB of bf16 weights (assumption: NVLink broadcast plus the engine's reload), spent bucket
    by bucket while the sender waits for each (``weight_buckets``)."""
    weight_buckets: int = 23
    """Buckets of a sync: 6.17e9 bytes in 256 MiB buckets (this runtime's and verl's default bucket size)."""
    engine_offload_s: float = 2.0
    """Collocated only: the engine frees its KV cache and weights before training, and takes them back
    after (each way; assumption, vLLM's sleep mode is of this order)."""
    turn_tokens_median: float = 180.0
    """Median tokens of a turn that ends in a search (assumption: reasoning before the query)."""
    answer_tokens_median: float = 90.0
    """Median tokens of a turn that ends in an answer (assumption)."""
    turn_tokens_sigma: float = 0.6
    """Log-normal spread of turn lengths: the long tail (assumption). At 0.6, 4.5 % of search turns (median 180)
    and 0.04 % of answer turns (median 90) reach the 500-token cap; sigma 1 sent 15 % of search turns there."""
    search_probability: tuple[float, ...] = (0.9, 0.55, 0.4, 0.3)
    """Chance that turn k searches rather than answers, given k searches so far (assumption, shaped after
    GRPO's 1-2 searches a question in Search-R1 runs; the turn after the last listed one answers)."""
    passage_words: int = 100
    """Words of each returned passage (Search-R1's wiki-18 passages are about 100 words)."""
    search_base_s: float = 0.08
    """One retrieval request: fixed part (assumption; FlashRAG #4: faiss takes 0.05 s of a 256-query batch)."""
    search_per_query_s: float = 0.002
    """One retrieval request: per query, the e5 encoding (assumption; fp16 on a GPU)."""
    slow_search_probability: float = 0.02
    """Share of requests that are slow (a busy retriever, a GC pause; assumption)."""
    slow_search_s: float = 2.0
    """Extra time of a slow request (assumption)."""
    tokens_after_action: float = 0.0
    """Share of a turn's tokens decoded after its action tag, when the engine is not told to stop there and the loop
    cuts the text afterwards (Search-R1's loop, ``lockstep`` without the stop: 0.25, an assumption after its users'
    reports of over 20 % of decoding wasted); 0 when generation stops at the tag, as in this runtime."""
    prefix_cache: bool = True
    """A later turn of a trajectory prefills only its new tokens (vLLM's prefix cache); false: its whole context
    (Search-R1: ``free_cache_engine: True`` drops the cache after every generate call)."""
    trainer_offload_s: float = 0.0
    """Seconds a step the actor spends moving its FSDP state to and from the host (0 for this runtime's GPU recipes;
    Search-R1 offloads parameters, gradients and optimizer: ``lockstep`` sets it)."""
    time_scale: float = 1.0
    """Simulated seconds per wall second: 2 runs everything twice as fast as the cluster would."""

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences holding ``context_tokens`` tokens of KV cache together."""
        memory = (self.weight_bytes + self.kv_bytes_per_token * context_tokens) / (
            self.hbm_bytes_per_s * self.decode_bandwidth_efficiency)
        compute = 2 * self.params * batch / (self.peak_flops * self.prefill_mfu)
        return self.decode_step_overhead_s + max(memory, compute)

    def prefill_s(self, tokens: int) -> float:
        return 2 * self.params * tokens / (self.peak_flops * self.prefill_mfu)

    def train_s(self, tokens: float) -> float:
        """One rank's update over ``tokens`` tokens (its share of the batch)."""
        return self.train_flops_per_token * self.params * tokens / (self.peak_flops * self.train_mfu)

    def logprob_s(self, tokens: float) -> float:
        """One rank's old and reference log-prob passes over ``tokens`` tokens."""
        return self.logprob_flops_per_token * self.params * tokens / (self.peak_flops * self.train_mfu)

    def packed_decode_s(self, steps: int, batch: int, context_tokens: int) -> float:
        """What ``steps`` decode steps of ``batch`` sequences would cost inside a full running batch
        (``max_running_requests`` sequences of the same mean context): their share of full steps. The ideal
        line adds this up: the decoding work with no engine ever short of sequences."""
        full = self.max_running_requests
        per_sequence = context_tokens / max(batch, 1)
        return steps * self.decode_step_s(full, int(per_sequence * full)) * batch / full

    def search_s(self, queries: int, rng: random.Random) -> float:
        slow = self.slow_search_s if rng.random() < self.slow_search_probability else 0.0
        return self.search_base_s + self.search_per_query_s * queries + slow

    def wall(self, simulated_s: float) -> float:
        return simulated_s / self.time_scale


@dataclass(frozen=True)
class Settings:
    """What every simulated component reads from ``RLINF_PIPELINE_SIM``."""

    model: ServiceModel = field(default_factory=ServiceModel)
    """The service times."""
    trace_dir: str = ""
    """Folder each component appends its busy intervals to (``<group>-<pid>.jsonl``)."""


def write_settings(path: Path, settings: Settings) -> Path:
    path.write_text(json.dumps({"model": asdict(settings.model), "trace_dir": settings.trace_dir}))
    return path


def read_settings() -> Settings:
    path = os.environ.get(SETTINGS_ENV)
    if not path:
        raise RuntimeError(f"{SETTINGS_ENV} is not set: the simulated components are built by benchmarks/pipeline.py")
    raw = json.loads(Path(path).read_text())
    model = dict(raw["model"])
    model["search_probability"] = tuple(model["search_probability"])
    return Settings(model=ServiceModel(**model), trace_dir=raw["trace_dir"])


class Trace:
    """Appends busy intervals (wall clock, ``time.time()``) of one process's component to its own file."""

    def __init__(self, settings: Settings, group: str):
        self.path = Path(settings.trace_dir) / f"{group}-{os.getpid()}.jsonl"
        self.group = group

    def interval(self, start: float, end: float, what: str, **extra) -> None:
        row = {"group": self.group, "pid": os.getpid(), "start": start, "end": end, "what": what, **extra}
        with self.path.open("a") as out:
            out.write(json.dumps(row) + "\n")


class BusyCounter:
    """Counts work in flight and records one interval per stretch with any."""

    def __init__(self, trace: Trace, what: str):
        self.trace, self.what, self.in_flight, self.since = trace, what, 0, 0.0

    def enter(self) -> None:
        if self.in_flight == 0:
            self.since = time.time()
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.trace.interval(self.since, time.time(), self.what)

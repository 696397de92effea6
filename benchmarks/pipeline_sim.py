"""Simulated service times for ``benchmarks/pipeline.py``: a rollout engine, a trainer and a search backend
that take the time a Qwen2.5-3B Search-R1 run on H100s would take, and log when each was busy.

Everything around them is the real runtime (Ray worker groups, the agent loops, the SearchTool group and
its client, the reward ranks, the channel of finished groups, weight sync, the driver's scheduling);
only the work inside an engine, a trainer and the retriever is replaced by sleeping for the time the
``ServiceModel`` gives. They are named in the run's config by dotted path, so every worker process
builds them as it would build the real ones:

- ``rollout.rollout_backend: benchmarks.pipeline_sim:build_engine``
- ``actor.training_backend: benchmarks.pipeline_sim:SimulatedTrainer``
- ``tools.search.backend: benchmarks.pipeline_sim:build_search_backend``

The model and the trace folder reach the workers through the environment variable ``RLINF_PIPELINE_SIM``
(the path of a JSON file ``write_settings`` wrote): the factories take only their config sections.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.tools.search.base import SearchHit

SETTINGS_ENV = "RLINF_PIPELINE_SIM"
"""Environment variable naming the settings JSON (``write_settings``)."""


@dataclass(frozen=True)
class ServiceModel:
    """How long each piece of work takes on the simulated cluster (seconds are simulated seconds).

    Model: Qwen2.5-3B-Instruct (config.json: 36 layers, 2 key-value heads of 128, 3.09e9 parameters), bf16.
    Device: one H100 SXM per engine or trainer rank (data sheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16).
    The efficiencies and the trajectory and search shapes are assumptions, named as such; docs/benchmarks.md
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
    """Actor to engines, 6 GB of bf16 weights (assumption: NVLink broadcast plus the engine's reload)."""
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


class _Busy:
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


# ---- the engine ------------------------------------------------------------------------------------

@dataclass
class _Request:
    remaining: int
    context: int
    prefill: int
    done: asyncio.Future


class SimulatedEngine:
    """A continuous-batching engine: each step decodes one token of every running sequence in
    ``decode_step_s(batch, context)``; new requests join between steps (their new tokens prefilled, a
    trajectory's earlier turns being in the prefix cache unless ``prefix_cache`` is off). A turn's length and
    whether it searches or answers are drawn from the request's seed, so every pipeline mode samples the same
    trajectories. The engine serves from a loop of its own on a thread, so callers from any event loop (an
    asynchronous run's rollout calls of several steps at once) meet in one running batch."""

    CHUNK = 16
    """Decode steps simulated per wake-up (each slept as their sum); finishing sequences end a chunk early."""

    def __init__(self, tokenizer, settings: Settings, seed: int):
        self.tokenizer, self.model = tokenizer, settings.model
        self.trace = Trace(settings, "rollout")
        self.rng = random.Random(seed)
        self.weight_version = 0
        encode = self._encode
        self.filler = encode(" the")[0]
        (self.search_close,) = encode("</search>")
        self.response_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.answer_ids = encode(" <answer> unknown </answer>")
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        threading.Thread(target=self._loop.run_forever, name="simulated-engine", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _plan(self, prompt_ids: list[int], sampling: SamplingParams) -> tuple[list[int], str, str | None]:
        """This turn's ids, finish reason and stop string."""
        rng = random.Random(sampling.seed) if sampling.seed is not None else self.rng
        start = _last_index(prompt_ids, self.response_start) + 1
        searches = prompt_ids[start:].count(self.search_close)
        table = self.model.search_probability
        search = searches < len(table) and rng.random() < table[searches]
        median = self.model.turn_tokens_median if search else self.model.answer_tokens_median
        wanted = max(8, int(median * math.exp(self.model.turn_tokens_sigma * rng.gauss(0.0, 1.0))))
        cap = sampling.max_new_tokens
        if wanted >= cap:  # the long tail: cut at the turn's limit with no action (the loop corrects it)
            return [self.filler] * cap, "length", None
        action = self._encode(f" <search> q{rng.randrange(10**6)} </search>") if search else self.answer_ids
        ids = [self.filler] * max(0, wanted - len(action)) + action
        if len(ids) > cap:  # the response budget ends inside the action
            return [self.filler] * cap, "length", None
        return ids, "stop", "</search>" if search else "</answer>"

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        ids, finish, stop = self._plan(prompt_ids, sampling)
        if self.model.prefix_cache:
            last_search = _last_index(prompt_ids, self.search_close)
            new_tokens = len(prompt_ids) - (last_search + 1 if last_search >= 0 else 0)
        else:
            new_tokens = len(prompt_ids)
        served = asyncio.run_coroutine_threadsafe(self._admit(len(ids), len(prompt_ids), new_tokens), self._loop)
        await asyncio.wrap_future(served)
        return GenerationOutput(ids, [-1.0] * len(ids), finish, stop)

    async def _admit(self, tokens: int, context: int, prefill: int) -> None:
        """On the engine's loop: queue the request and wait until its tokens are decoded."""
        request = _Request(remaining=tokens, context=context, prefill=prefill,
                           done=asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        self._wake.set()
        await request.done

    async def _serve(self) -> None:
        model = self.model
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            busy_since, ideal_s, tokens = time.time(), 0.0, 0
            while self._running or self._waiting:
                room = model.max_running_requests - len(self._running)
                joined, self._waiting = self._waiting[:room], self._waiting[room:]
                self._running += joined
                steps = min(self.CHUNK, min(r.remaining for r in self._running))
                batch, context = len(self._running), sum(r.context for r in self._running)
                prefill = model.prefill_s(sum(r.prefill for r in joined))
                seconds = prefill + sum(model.decode_step_s(batch, context + batch * k) for k in range(steps))
                ideal_s += model.wall(prefill + model.packed_decode_s(steps, batch, context + batch * steps // 2))
                tokens += steps * batch
                await asyncio.sleep(model.wall(seconds))
                for r in self._running:
                    r.remaining -= steps
                    r.context += steps
                    if r.remaining == 0:
                        r.done.set_result(None)
                self._running = [r for r in self._running if r.remaining > 0]
            # ideal_s: this stretch's decoding and prefill as if every step ran a full batch (the ideal line).
            self.trace.interval(busy_since, time.time(), "decode", ideal_s=ideal_s, tokens=tokens)

    def update_weights(self, state_dict: dict) -> None:
        start = time.time()
        time.sleep(self.model.wall(self.model.weight_sync_s))
        self.trace.interval(start, time.time(), "weight_sync")
        self.weight_version += 1

    def offload(self) -> None:
        start = time.time()
        time.sleep(self.model.wall(self.model.engine_offload_s))
        self.trace.interval(start, time.time(), "offload")

    def onload(self) -> None:
        start = time.time()
        time.sleep(self.model.wall(self.model.engine_offload_s))
        self.trace.interval(start, time.time(), "onload")

    async def aclose(self) -> None:
        pass


def _last_index(ids: list[int], token: int) -> int:
    """Index of the last ``token`` in ``ids``; -1 when absent."""
    try:
        return len(ids) - 1 - ids[::-1].index(token)
    except ValueError:
        return -1


def build_engine(config, *, device=None, seed: int = 0) -> SimulatedEngine:
    """``rollout.rollout_backend`` factory: the tokenizer of ``rollout.model.model_path``, simulated decoding."""
    from transformers import AutoTokenizer

    return SimulatedEngine(AutoTokenizer.from_pretrained(config.model_path), read_settings(), seed)


# ---- the trainer -----------------------------------------------------------------------------------

class SimulatedTrainer:
    """``PolicyTrainer``'s interface, sleeping for its rank's share of the batch's tokens instead of training.

    ``compute_logprobs`` sleeps for the old and reference passes over its rows (``logprob_flops_per_token``; the
    reference pass is folded in, so runs use ``algorithm.kl_beta: 0``) and returns the engine's log-probs as the
    old ones. An update pays ``train_flops_per_token`` for its tokens, plus the log-prob passes for any of them no
    ``compute_logprobs`` call scored first (a run with ``recompute_logprobs: false``): every mode does the same
    GPU work per token, whoever computes what."""

    packed = True
    serves_weights_from_host = True
    gathers_weights_collectively = False

    def __init__(self, config):
        self.config, self.device = config, torch.device("cpu")
        dist = torch.distributed
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        settings = read_settings()
        self.model, self.trace = settings.model, Trace(settings, "actor")
        self.global_step = 0
        self._scored_tokens = 0.0
        """Tokens (the whole batch's) whose log-prob passes ran and whose update has not yet."""

    def _train(self, batch, optimizer_steps: int, *, step_end: bool) -> dict[str, float]:
        tokens = float(batch.attention_mask.sum())
        unscored = max(0.0, tokens - self._scored_tokens)
        self._scored_tokens = max(0.0, self._scored_tokens - tokens)
        seconds = self.model.train_s(tokens / self.world_size) + self.model.logprob_s(unscored / self.world_size)
        seconds += self.model.trainer_offload_s if step_end else 0.0
        start = time.time()
        time.sleep(self.model.wall(seconds))
        self.global_step += optimizer_steps
        self.trace.interval(start, time.time(), "train", rank=self.rank, optimizer_step=self.global_step,
                            tokens=tokens)
        return {"actor/tokens": tokens}

    def train_on_batch(self, batch) -> dict[str, float]:
        return self._train(batch, self.config.n_minibatches, step_end=True)

    def train_on_minibatch(self, batch) -> dict[str, float]:
        return self._train(batch, 1, step_end=False)

    def compute_logprobs(self, batch):
        rows = list(range(self.rank, len(batch), self.world_size))
        tokens = float(batch.attention_mask.sum())
        start = time.time()
        time.sleep(self.model.wall(self.model.logprob_s(tokens / self.world_size)))
        self._scored_tokens += tokens
        self.trace.interval(start, time.time(), "logprobs", rank=self.rank, tokens=tokens)
        return rows, batch.rollout_logprobs[rows].clone()

    def build_reference(self, model_path: str):
        raise RuntimeError("the simulated trainer folds reference log-probs into its update: kl_beta 0")

    def offload_tensors(self):
        raise RuntimeError("the simulated trainer holds nothing to offload")

    def rollout_state_dict(self, dtype=None) -> dict[str, torch.Tensor]:
        return {"simulated.weight": torch.zeros(1)}

    def export_hf(self, path, state) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "SIMULATED").write_text("weights of a simulated trainer\n")

    def training_state(self, folder):
        from rlinf_search.checkpoint import TrainingState

        return TrainingState(scheduler={}, global_step=self.global_step, rng=())

    def load_training_state(self, state, folder) -> None:
        self.global_step = state.global_step


# ---- the search backend ----------------------------------------------------------------------------

class SimulatedSearchBackend:
    """A batched retriever answering after ``search_s``; passages of ``passage_words`` words."""

    batched = True
    target = "simulated retriever"

    def __init__(self, settings: Settings):
        self.model = settings.model
        self.busy = _Busy(Trace(settings, "search"), "retrieve")
        self.rng = random.Random(os.getpid())
        self.passage = " ".join(["the"] * self.model.passage_words)

    async def fetch(self, queries: list[str], topk: int, timeout_s: float) -> list[list[SearchHit]]:
        self.busy.enter()
        try:
            await asyncio.sleep(self.model.wall(self.model.search_s(len(queries), self.rng)))
        finally:
            self.busy.leave()
        return [[SearchHit(title=f"doc {i}", text=self.passage) for i in range(topk)] for _ in queries]

    async def aclose(self) -> None:
        pass


def build_search_backend(config) -> SimulatedSearchBackend:
    """``tools.search.backend`` factory."""
    return SimulatedSearchBackend(read_settings())

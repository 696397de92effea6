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
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.service_model import Settings, Trace, BusyCounter, read_settings
from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.tools.search.base import SearchHit
from rlinf_search.workers.weight_loading import weight_buckets

SIM_BUCKET_BYTES = 1 << 20
"""Bytes of each simulated bucket (``rollout.update_weights_bucket_megabytes: 1``): small, so a run moves few real
bytes, but one per modelled bucket."""


# ---- the engine ------------------------------------------------------------------------------------

@dataclass
class _Request:
    remaining: int
    context: int
    prefill: int
    done: asyncio.Future
    decoded: int = 0
    """Tokens decoded so far (what an abort keeps)."""


class SimulatedEngine:
    """A continuous-batching engine: each step decodes one token of every running sequence in
    ``decode_step_s(batch, context)``; new requests join between steps (their new tokens prefilled, a
    trajectory's earlier turns being in the prefix cache unless ``prefix_cache`` is off or new weights were loaded
    since: a load resets the cache, as vLLM's ``reset_prefix_cache`` does). A turn's length and whether it searches
    or answers are drawn from the request's seed, so every pipeline mode samples the same trajectories. The engine
    serves from a loop of its own on a thread, so callers from any event loop (an asynchronous run's rollout calls
    of several steps at once) meet in one running batch.

    Weights: ``update_weights`` takes the sync's buckets as the transport delivers them and spends
    ``weight_sync_s / weight_buckets`` on each before taking the next, so the sender waits for the loads as the
    real transport makes it. ``abort_all`` ends the requests in flight at the next decode step with the tokens they
    have; the rank's weight gate continues each on the new weights, and the continuation (the rest of the same
    planned turn) prefills the whole context again."""

    CHUNK = 16
    """Decode steps simulated per wake-up (each slept as their sum); finishing sequences end a chunk early, and an
    abort ends it at the step it lands in."""

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
        self._continuations: dict[tuple[int, ...], tuple[list[int], str, str | None]] = {}
        self._cached: dict[tuple[int, ...], int] = {}  # a finished turn's context -> the cache epoch it was in
        self._epoch = 0  # weight loads so far: each resets the prefix cache
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._abort = asyncio.Event()
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

    def _prefill_tokens(self, prompt_ids: list[int]) -> int:
        """Tokens of ``prompt_ids`` a request prefills: those after the trajectory's last turn when that turn's
        context is still cached (same weights, ``prefix_cache``), else all of them."""
        if not self.model.prefix_cache:
            return len(prompt_ids)
        last_search = _last_index(prompt_ids, self.search_close)
        if last_search < 0:
            return len(prompt_ids)  # a first turn: the group's shared prompt is its only prefix
        if self._cached.get(tuple(prompt_ids[: last_search + 1])) == self._epoch:
            return len(prompt_ids) - last_search - 1
        return len(prompt_ids)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        key = tuple(prompt_ids)
        planned = self._continuations.pop(key, None)
        ids, finish, stop = planned if planned is not None else self._plan(prompt_ids, sampling)
        prefill = len(prompt_ids) if planned is not None else self._prefill_tokens(prompt_ids)
        # Without a stop at the action tag the engine decodes on past it; the loop cuts those tokens off.
        wasted = int(len(ids) * self.model.tokens_after_action) if finish == "stop" and planned is None else 0
        served = asyncio.run_coroutine_threadsafe(self._admit(len(ids) + wasted, len(prompt_ids), prefill),
                                                  self._loop)
        decoded = await asyncio.wrap_future(served)
        if decoded < len(ids):  # aborted: the rest of the turn continues from these tokens
            self._continuations[key + tuple(ids[:decoded])] = (ids[decoded:], finish, stop)
            return GenerationOutput(ids[:decoded], [-1.0] * decoded, "abort")
        self._cached[key + tuple(ids)] = self._epoch
        return GenerationOutput(ids, [-1.0] * len(ids), finish, stop)

    async def _admit(self, tokens: int, context: int, prefill: int) -> int:
        """On the engine's loop: queue the request and wait until its tokens are decoded or it is aborted;
        returns the tokens decoded."""
        request = _Request(remaining=tokens, context=context, prefill=prefill,
                           done=asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        self._wake.set()
        return await request.done

    def abort_all(self) -> None:
        """End every request in flight at the decode step running now (thread-safe; returns at once)."""
        def abort() -> None:
            if self._running or self._waiting:  # nothing in flight: nothing to end (a later request must not be)
                self._abort.set()

        self._loop.call_soon_threadsafe(abort)

    async def _serve(self) -> None:
        model = self.model
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            busy_since, ideal_s, tokens = time.time(), 0.0, 0
            while self._running or self._waiting:
                if self._abort.is_set():
                    self._end_all()
                    break
                room = model.max_running_requests - len(self._running)
                joined, self._waiting = self._waiting[:room], self._waiting[room:]
                self._running += joined
                steps = min(self.CHUNK, min(r.remaining for r in self._running))
                batch, context = len(self._running), sum(r.context for r in self._running)
                prefill = model.prefill_s(sum(r.prefill for r in joined))
                step_s = [model.decode_step_s(batch, context + batch * k) for k in range(steps)]
                steps = await self._sleep_steps(prefill, step_s)
                ideal_s += model.wall(prefill + model.packed_decode_s(steps, batch, context + batch * steps // 2))
                tokens += steps * batch
                for r in self._running:
                    r.remaining -= steps
                    r.context += steps
                    r.decoded += steps
                    if r.remaining == 0:
                        r.done.set_result(r.decoded)
                self._running = [r for r in self._running if r.remaining > 0]
            self._abort.clear()  # an abort that landed as the last requests finished ends nothing later
            # ideal_s: this stretch's decoding and prefill as if every step ran a full batch (the ideal line).
            self.trace.interval(busy_since, time.time(), "decode", ideal_s=ideal_s, tokens=tokens)

    async def _sleep_steps(self, prefill_s: float, step_s: list[float]) -> int:
        """Sleep the prefill and the decode steps; an abort cuts it after the step it lands in. The steps done."""
        total = self.model.wall(prefill_s + sum(step_s))
        started = time.time()
        try:
            await asyncio.wait_for(self._abort.wait(), timeout=total)
        except asyncio.TimeoutError:
            return len(step_s)
        elapsed, done = self.model.wall(prefill_s), 0
        while done < len(step_s) and elapsed < time.time() - started:
            elapsed += self.model.wall(step_s[done])
            done += 1
        await asyncio.sleep(max(0.0, started + elapsed - time.time()))  # the step it landed in finishes
        return done

    def _end_all(self) -> None:
        """An abort: every request in flight or waiting is answered with the tokens it has."""
        self._abort.clear()
        for r in self._running + self._waiting:
            r.done.set_result(r.decoded)
        self._running, self._waiting = [], []

    def update_weights(self, weights) -> None:
        start = time.time()
        buckets = 0
        for _ in weight_buckets(weights):  # the next bucket is taken once this one is loaded: the sender waits
            buckets += 1
            time.sleep(self.model.wall(self.model.weight_sync_s / self.model.weight_buckets))
        self.trace.interval(start, time.time(), "weight_sync", buckets=buckets)
        self.weight_version += 1
        self._epoch += 1
        self._cached.clear()

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

    def rollout_state_dict(self, dtype=None, on_device: bool = False) -> dict[str, torch.Tensor]:
        """One small tensor per modelled bucket, each filling a bucket of ``SIM_BUCKET_BYTES`` (the runs set
        ``rollout.update_weights_bucket_megabytes`` to match): the sync streams ``weight_buckets`` buckets, each
        loaded in its modelled time before the next is taken."""
        count = SIM_BUCKET_BYTES // 4
        return {f"simulated.bucket_{i}": torch.zeros(count) for i in range(self.model.weight_buckets)}

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
        self.busy = BusyCounter(Trace(settings, "search"), "retrieve")
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

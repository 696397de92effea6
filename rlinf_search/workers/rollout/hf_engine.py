"""The Hugging Face generation engine: the CPU default, and a reference for the others.

Concurrent ``generate`` calls are decoded together with continuous batching. One decode thread owns
the model: between two decode steps it prefills whatever requests arrived and merges them into the
running batch (KV cache included); a row that finishes (stop string, end token, token limit) is
answered at once and leaves the batch. So an agent whose turn ended searches while the others
decode, and its next turn joins at the next step instead of waiting for the batch to drain. Every
sampled id is returned as sampled, with its log-prob.

``abort_all`` ends every request admitted so far at the next token boundary (``finish_reason`` ``abort``, with
the ids sampled so far): the rank's weight gate then loads new weights and continues them
(``weight_gate.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import DynamicCache

from rlinf_search.agents.engine import check_request
from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.plugin_settings import with_settings
from rlinf_search.workers.offload import move_module
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.workers.rollout.finish_check import FinishCheck, end_token_ids
from rlinf_search.workers.rollout.hf_cache import cache_kwargs
from rlinf_search.workers.rollout.kv_room import with_room
from rlinf_search.workers.rollout.lean_decode import lean_decoder
from rlinf_search.workers.rollout.prefix_cache import (
    CachedPrefix,
    PrefixCache,
    prefill_inputs,
    row_states,
    shared_prefix_length,
)
from rlinf_search.workers.rollout.running_batch import RunningBatch
from rlinf_search.workers.rollout.sampling import sample_next_tokens
from rlinf_search.workers.weight_loading import Weights, load_weight_buckets

GATHER_GAP_S = 0.002
"""An idle engine that gets a request waits for more while they arrive at most this far apart (a few milliseconds
a burst; a lone request waits this once)."""


@dataclass(frozen=True)
class HFEngineConfig:
    """How to load and run the engine."""

    model_path: str
    """A Hugging Face causal LM directory (or hub id where a hub is reachable)."""
    device: str | None = None
    """``cuda``, ``cpu``...; default: cuda when available."""
    dtype: str = "auto"
    """``float32``, ``bfloat16``, ``float16``, or ``auto`` (bf16 on GPU, fp32 on CPU)."""
    max_batch_size: int = 64
    """Most requests decoded at once; more wait until rows finish."""
    seed: int = 0
    """Seed of the shared sampling generator (requests without a seed of their own draw from it)."""
    admit_every_steps: int = 8
    """Waiting requests join the running batch at least this often (in decode steps), sooner when
    they are a quarter of the batch."""
    prefix_cache_tokens: int = 1 << 16
    """Most tokens whose key/value states are kept between a trajectory's turns (``prefix_cache.py``); 0: none,
    every turn prefills its whole context."""
    shared_prefix_tokens: int = 64
    """Prompts prefilled together that start alike (a template) have that start computed once when it saves at
    least this many positions; 0: never."""
    lean_decode: bool = True
    """Decode steps of a Qwen2-architecture float32 model on CPU run through ``lean_decode.LeanDecoder`` (checked
    against transformers' forward when the engine starts); False: transformers' forward every step."""


@dataclass
class EngineStats:
    """Counters for tests, benchmarks and logs."""

    requests: int = 0
    """generate() calls admitted."""
    prefills: int = 0
    """Prefill passes; each admits every request that arrived since the previous step."""
    decode_steps: int = 0
    """Decode passes over the running batch."""
    generated_tokens: int = 0
    """Tokens sampled in total; generated_tokens / decode_steps is the mean running batch."""
    prefilled_tokens: int = 0
    """Prompt tokens computed by prefills (a prompt sent by several requests at once counts once)."""
    reused_tokens: int = 0
    """Prompt tokens whose states came from the prefix cache instead."""


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator
    epoch: int
    """When it arrived: ``abort_all`` ends every request whose epoch is below the one it drew."""
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def result(self, finish_reason: str, stop_string: str | None = None) -> GenerationOutput:
        return GenerationOutput(list(self.output_ids), list(self.logprobs), finish_reason, stop_string)

    def resolve(self, finish_reason: str, stop_string: str | None = None) -> None:
        self.loop.call_soon_threadsafe(_set_result, self.future, self.result(finish_reason, stop_string))

    def fail(self, exc: BaseException) -> None:
        self.loop.call_soon_threadsafe(_set_exception, self.future, exc)


def _set_result(future: asyncio.Future, result) -> None:
    if not future.done():  # the caller may have been cancelled
        future.set_result(result)


def _set_results(answers: list[tuple[asyncio.Future, GenerationOutput]]) -> None:
    for future, result in answers:
        _set_result(future, result)


def _answer(finished: list[tuple[_Request, GenerationOutput]]) -> None:
    """Hand each finished request its result, with one wake-up per event loop: a wake-up per request costs the
    engine thread a pipe write and the loop's thread a turn at the interpreter lock, every step."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for request, result in finished:
        by_loop.setdefault(request.loop, []).append((request.future, result))
    for loop, answers in by_loop.items():
        loop.call_soon_threadsafe(_set_results, answers)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class HFGenerationEngine:
    """Batched token-in/token-out generation with a Hugging Face causal LM."""

    def __init__(self, config: HFEngineConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model_path, dtype=_resolve_dtype(config.dtype, self.device)).to(self.device).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.finish = FinishCheck(self.tokenizer, end_token_ids(self.model, self.tokenizer))
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.lean = lean_decoder(self.model) if config.lean_decode else None
        self.weight_version = 0
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self._weights_lock = threading.Lock()  # no step decodes with half-loaded weights
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_guard = threading.Lock()
        self._offloaded = False
        self._steps_since_admit = 0
        self._epochs = itertools.count()
        self._abort_below = 0  # requests of an earlier epoch end at the next token boundary
        self.stats = EngineStats()
        self.prefix_cache = PrefixCache(config.prefix_cache_tokens)

    # ---- the async interface -------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        check_request(prompt_ids, sampling, positions=self.max_positions, offloaded=self._offloaded)
        loop = asyncio.get_running_loop()
        self._ensure_thread()
        generator = (self._generator if sampling.seed is None
                     else torch.Generator(device=self.device).manual_seed(sampling.seed))
        request = _Request(list(prompt_ids), sampling, loop.create_future(), loop, generator, next(self._epochs))
        self._inbox.put(request)
        return await request.future

    def _ensure_thread(self) -> None:
        with self._thread_guard:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
                self._thread.start()

    def abort_all(self) -> None:
        """End every request admitted so far at its next token boundary, answered with the ids it has and
        ``finish_reason`` ``abort``; requests that arrive later are not touched. Thread-safe, returns at once."""
        self._abort_below = next(self._epochs)

    def _aborted(self, request: _Request) -> bool:
        return request.epoch < self._abort_below

    async def aclose(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(None)
            await asyncio.to_thread(self._thread.join)

    # ---- weights and memory --------------------------------------------------------------
    def update_weights(self, weights: Weights) -> None:
        """Load a state dict, or buckets of one as they arrive (each copied into the model, then let go)."""
        with self._weights_lock:
            self.prefix_cache.clear()  # states computed by the old weights
            load_weight_buckets(self.model, weights)
            self.weight_version += 1

    def offload(self) -> None:
        with self._weights_lock:
            self.prefix_cache.clear()  # the memory is what offloading is for
            move_module(self.model, "cpu")  # on a CPU engine: no copies
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._offloaded = True

    def onload(self) -> None:
        with self._weights_lock:
            move_module(self.model, self.device)
            self._offloaded = False

    # ---- decoding (runs in the engine thread) -------------------------------------------
    def _should_admit(self, batch: RunningBatch | None) -> bool:
        """Admit waiting requests now, or let them gather a little longer?

        Each admission is a prefill plus a copy of the running KV cache, so admitting one request
        per step costs more than it saves; waiting requests are admitted once they are a quarter
        of the running batch, or after ``admit_every_steps`` steps, whichever comes first.
        """
        if not batch:
            return True
        waiting = self._inbox.qsize()
        return waiting > 0 and (waiting * 4 >= len(batch) or self._steps_since_admit >= self.config.admit_every_steps)

    def _take_new(self, batch: RunningBatch | None) -> tuple[list[_Request], bool]:
        """Requests to admit now (blocking only when nothing is running); and whether to stop."""
        new: list[_Request] = []
        self._steps_since_admit += 1
        if not self._should_admit(batch):
            return new, False
        self._steps_since_admit = 0
        room = self.config.max_batch_size - (len(batch) if batch else 0)
        if not batch:
            first = self._inbox.get()
            if first is None:
                return [], True
            new.append(first)
        while len(new) < room:
            try:
                # An idle engine's first request is usually one of a burst (a batch's trajectories start together,
                # each sent as the agent loop reaches it): gather while they keep coming, so they share one prefill
                # (and each prompt sent by a whole group is computed once) instead of the first going alone.
                item = self._inbox.get(timeout=GATHER_GAP_S) if not batch else self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._inbox.put(None)  # finish the running rows first, then stop
                break
            new.append(item)
        return new, False

    def _serve(self) -> None:
        batch: RunningBatch | None = None
        while True:
            new, stop = self._take_new(batch)
            if stop:
                return
            new = self._answer_aborted(new)
            try:
                with self._weights_lock, torch.inference_mode():
                    joined = self._prefill(new) if new else None
                    if joined and batch:
                        batch.absorb(joined)
                    elif joined:
                        batch = joined
                    if batch:
                        batch = self._decode_step(batch)
                    if batch:
                        batch = self._leave_aborted(batch)
            except BaseException as exc:  # noqa: BLE001 - every waiting caller must hear of the failure
                for request in (batch.requests if batch else []) + new:
                    request.fail(exc)
                batch = None

    def _answer_aborted(self, requests: list[_Request]) -> list[_Request]:
        """The requests not aborted; the others are answered with what they have."""
        keep = []
        for request in requests:
            if self._aborted(request):
                request.resolve("abort")
            else:
                keep.append(request)
        return keep

    def _leave_aborted(self, batch: RunningBatch) -> RunningBatch | None:
        """The running rows ``abort_all`` ended leave the batch, answered at this token boundary."""
        keep = [row for row, request in enumerate(batch.requests) if not self._aborted(request)]
        if len(keep) == len(batch):
            return batch
        for request in batch.requests:
            if self._aborted(request):
                request.resolve("abort")
        if not keep:
            return None
        batch.select(keep)
        return batch

    def _prefill(self, new: list[_Request]) -> RunningBatch | None:
        """One pass over the new requests' prompts: each after the cached prefix it starts with (if any), each
        distinct prompt once; then every request gets its rows of the cache and its first token."""
        self.stats.prefills += 1
        self.stats.requests += len(new)
        prefixes = self._with_shared_prefix(new, [self.prefix_cache.take(r.prompt_ids) for r in new])
        inputs = prefill_inputs([r.prompt_ids for r in new], prefixes, self.pad_id)
        self.stats.prefilled_tokens += int(inputs.attention_mask[:, -inputs.input_ids.shape[1]:].sum())
        self.stats.reused_tokens += sum(len(p.ids) for p in prefixes if p is not None)
        cache = with_room(DynamicCache())
        for layer, (keys, values) in enumerate(inputs.prefix or []):
            cache.update(keys.to(self.device), values.to(self.device), layer)
        mask = inputs.attention_mask.to(self.device)
        out = self.model(input_ids=inputs.input_ids.to(self.device), attention_mask=mask,
                         position_ids=inputs.position_ids.to(self.device), **cache_kwargs(self.model, cache),
                         use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :].float()
        if len(inputs.rows) > logits.shape[0]:  # equal prompts were computed once: give each request its copy
            rows = inputs.rows.to(self.device)
            cache.batch_select_indices(rows)
            mask, logits = mask[rows], logits[rows]
        positions = torch.tensor([len(r.prompt_ids) for r in new], dtype=torch.long, device=self.device)
        joined = RunningBatch(new, cache, mask, positions, torch.zeros(len(new), dtype=torch.long))
        return self._sample_and_settle(joined, logits)

    def _with_shared_prefix(self, new: list[_Request], prefixes: list) -> list:
        """``prefixes``, where the requests with none share a prefix (a prompt template, say), with one computed
        once for them: the prefill then computes each prompt from where they part."""
        if not self.config.shared_prefix_tokens:
            return prefixes
        bare = [r.prompt_ids for r, p in zip(new, prefixes) if p is None]
        length = shared_prefix_length(bare, min_tokens=self.config.shared_prefix_tokens)
        if not length:
            return prefixes
        ids = bare[0][:length]
        cache = DynamicCache()
        self.model(input_ids=torch.tensor([ids], device=self.device), **cache_kwargs(self.model, cache),
                   use_cache=True, logits_to_keep=1)
        self.stats.prefilled_tokens += length
        shared = CachedPrefix(tuple(ids), [layer.keys[0] for layer in cache.layers],
                              [layer.values[0] for layer in cache.layers])
        return [shared if p is None else p for p in prefixes]

    def _decode_step(self, batch: RunningBatch) -> RunningBatch | None:
        self.stats.decode_steps += 1
        mask = batch.advance()
        if self.lean is not None:
            logits = self.lean.step(batch.pending, batch.positions, mask, batch.cache)
        else:
            logits = self.model(input_ids=batch.pending.view(-1, 1), attention_mask=mask,
                                position_ids=batch.positions.view(-1, 1), **cache_kwargs(self.model, batch.cache),
                                use_cache=True).logits[:, -1, :]
        batch.positions = batch.positions + 1
        return self._sample_and_settle(batch, logits.float())

    def _sample_and_settle(self, batch: RunningBatch, logits: torch.Tensor) -> RunningBatch | None:
        """Sample each row's next token, answer the rows that finished, and keep the rest."""
        tokens, logprobs = sample_next_tokens(logits, [r.sampling for r in batch.requests],
                                              [r.generator for r in batch.requests])
        self.stats.generated_tokens += len(batch)
        keep, finished = [], []
        for row, (request, token, logprob) in enumerate(zip(batch.requests, tokens.tolist(), logprobs.tolist())):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            finish = self.finish.reason(request.sampling, request.output_ids)
            if finish is None:
                keep.append(row)
            else:
                if finish[0] == "stop":  # a tool call follows: the next turn will start with this context
                    self._keep_prefix(batch, row, request)
                finished.append((request, request.result(*finish)))
        _answer(finished)
        batch.pending = tokens
        if not keep:
            return None
        if len(keep) < len(batch):
            batch.select(keep)
        return batch

    def _keep_prefix(self, batch: RunningBatch, row: int, request: _Request) -> None:
        """Keep the states the row has cached: its prompt and output but the token just sampled."""
        if not self.prefix_cache.max_tokens:
            return
        ids = request.prompt_ids + request.output_ids[:-1]
        if int(batch.mask[row].sum()) != len(ids):  # never reuse states that do not match their ids
            return
        self.prefix_cache.store(ids, *row_states(batch.cache, batch.mask, row))


class HFEngineSettings(BaseModel):
    """``rollout.engine_settings`` of ``rollout_backend: hf``: its own tunables, defaults ``HFEngineConfig``'s."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    admit_every_steps: int = Field(HFEngineConfig.admit_every_steps, ge=1)
    """Waiting requests join the running batch at least this often, in decode steps."""
    prefix_cache_tokens: int = Field(HFEngineConfig.prefix_cache_tokens, ge=0)
    """Most tokens whose key/value states are kept between a trajectory's turns; 0: every turn prefills its whole
    context."""
    shared_prefix_tokens: int = Field(HFEngineConfig.shared_prefix_tokens, ge=0)
    """Prompts prefilled together that start alike have that start computed once when it saves at least this many
    positions; 0: never."""
    lean_decode: bool = HFEngineConfig.lean_decode
    """Decode a Qwen2-architecture float32 model on CPU without transformers' per-call work (checked against its
    forward at start-up); false: transformers' forward every step."""


@with_settings(HFEngineSettings)
def build_hf_engine(config: RolloutConfig, *, device: str | None = None, seed: int = 0) -> HFGenerationEngine:
    """``rollout.rollout_backend: hf``."""
    own = config.engine_settings or HFEngineSettings()
    return HFGenerationEngine(HFEngineConfig(config.model_path, device=device, dtype=config.dtype,
                                             max_batch_size=config.max_running_requests, seed=seed,
                                             admit_every_steps=own.admit_every_steps,
                                             prefix_cache_tokens=own.prefix_cache_tokens,
                                             shared_prefix_tokens=own.shared_prefix_tokens,
                                             lean_decode=own.lean_decode))

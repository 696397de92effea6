"""The vLLM engine's own logic, without vLLM: output mapping, weight blobs, and weights that arrive
while the engine sleeps (sleep mode needs CUDA, so the heavy lane cannot run that path on CPU)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlinf_search.workers.rollout import bucket_files
from rlinf_search.workers.rollout.base import build_engine, engine_factory
from rlinf_search.workers.rollout.bucket_files import bucket_file, file_parts, read_bucket_file
from rlinf_search.workers.rollout.config import RolloutConfig
from rlinf_search.workers.rollout.vllm_engine import (
    VLLMEngineConfig,
    VLLMGenerationEngine,
    to_generation_output,
)


def _completion(ids, finish_reason, stop_reason=None):
    logprobs = [{token: SimpleNamespace(logprob=-0.5 * (i + 1))} for i, token in enumerate(ids)]
    return SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish_reason, stop_reason=stop_reason)


@pytest.mark.parametrize("finish, stop_reason, expected", [
    ("stop", "</search>", ("stop", "</search>")),  # a stop string
    ("stop", None, ("eos", None)),                  # the EOS token
    ("stop", 151643, ("eos", None)),                # another end token (generation_config)
    ("length", None, ("length", None)),
])
def test_finish_reasons_map_onto_ours(finish, stop_reason, expected):
    out = to_generation_output(_completion([5, 9, 7], finish, stop_reason))
    assert out.output_ids == [5, 9, 7] and out.logprobs == [-0.5, -1.0, -1.5]
    assert (out.finish_reason, out.stop_string) == expected


def test_an_aborted_request_is_an_error():
    with pytest.raises(RuntimeError, match="finish_reason 'abort'"):
        to_generation_output(_completion([5], "abort"))


def test_parts_split_by_size_and_follow_the_buckets_as_they_arrive():
    pulled = []

    def buckets():
        for index in range(2):
            pulled.append(index)
            yield {f"w{index}a": torch.zeros(8), f"w{index}b": torch.zeros(8), f"w{index}c": torch.zeros(64)}

    parts = file_parts(buckets(), max_bytes=2 * 8 * 4)
    assert sorted(next(parts)) == ["w0a", "w0b"] and pulled == [0]  # bucket 1 not asked for yet
    assert [sorted(part) for part in parts] == [["w0c"], ["w1a", "w1b"], ["w1c"]] and pulled == [0, 1]


@pytest.mark.parametrize("shm", ["present", "missing"])
def test_a_bucket_file_reads_back_exactly_with_a_tied_tensor_written_once(tmp_path, monkeypatch, shm):
    if shm == "missing":  # a container without /dev/shm room: a temporary directory instead
        monkeypatch.setattr(bucket_files, "SHM_DIR", tmp_path / "absent")
    embed = torch.randn(16, 8)
    part = {"model.embed_tokens.weight": embed, "lm_head.weight": embed,
            "model.norm.weight": torch.randn(8).to(torch.bfloat16), "steps": torch.tensor(3), "empty": torch.zeros(0)}
    with bucket_file(part) as (path, layout):
        assert Path(path).parent == (Path("/dev/shm") if shm == "present" else Path(tempfile.gettempdir()))
        offsets = {name: offset for name, _, _, offset, _ in layout}
        assert offsets["lm_head.weight"] == offsets["model.embed_tokens.weight"]
        assert Path(path).stat().st_size < 2 * embed.nbytes  # the head is not written twice
        got = read_bucket_file(path, layout)
    assert not Path(path).exists()  # deleted once loaded; the mapping outlives it
    assert got.keys() == part.keys()
    for name, tensor in part.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


class FakeAsyncLLM:
    """Records what the engine asks of vLLM."""

    def __init__(self):
        self.calls = []

    async def collective_rpc(self, method, args=()):
        self.calls.append(method)

    async def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    async def sleep(self, level):
        self.calls.append(f"sleep{level}")

    async def wake_up(self, tags=None):
        self.calls.append(f"wake_up:{','.join(tags) if tags else 'all'}")

    def shutdown(self):
        self.calls.append("shutdown")


@pytest.fixture()
def engine():
    engine = object.__new__(VLLMGenerationEngine)  # everything __init__ sets, with a fake vLLM
    engine.config = VLLMEngineConfig("unused", sleep_mode=True)
    engine.weight_version, engine._offloaded, engine._weights_awake = 0, False, False
    engine.max_model_len = 64
    engine._loop = asyncio.new_event_loop()
    engine._thread = threading.Thread(target=engine._loop.run_forever, daemon=True)
    engine._thread.start()
    engine._llm = fake = FakeAsyncLLM()
    yield engine, fake
    engine.close()


def test_weights_that_arrive_asleep_wake_the_weights_only(engine):
    engine, llm = engine
    weights = {"w": torch.ones(2)}
    loading = ["begin_hf_weights", "load_hf_bucket", "finish_hf_weights", "reset_prefix_cache"]
    engine.update_weights(weights)
    assert llm.calls == loading and engine.weight_version == 1
    llm.calls.clear()
    engine.offload()
    engine.update_weights(weights)  # the collocated step syncs right after training, engine asleep
    assert llm.calls == ["sleep1", "wake_up:weights", *loading] and engine.weight_version == 2
    with pytest.raises(RuntimeError, match="offloaded"):
        asyncio.run(engine.generate([1, 2], SimpleNamespace()))
    engine.onload()  # the KV cache is what still sleeps
    assert llm.calls[-1] == "wake_up:kv_cache"
    llm.calls.clear()
    engine.offload()
    engine.onload()  # nothing new arrived: the CPU copy of the weights comes back as it was
    assert llm.calls == ["sleep1", "wake_up:all"]


def test_registry_resolves_vllm_without_importing_it(tiny_model_dir):
    assert engine_factory("vllm").__name__ == "build_vllm_engine"
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="needs the vllm package"):
            build_engine(RolloutConfig(backend="vllm", model_path=str(tiny_model_dir)), device="cpu")

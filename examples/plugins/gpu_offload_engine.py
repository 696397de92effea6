"""An engine of your own, named in the config by dotted path: one file, no package edit.

    rollout:
      rollout_backend: examples.plugins.gpu_offload_engine:build

It generates with the HF engine, and declares traits as an engine like vLLM would: it releases its memory between
phases only on GPUs (so on CPU slots the rollout needs devices of its own) and its log-probs are of the top-k/top-p
filtered distribution (so training on them needs top_k 0 and top_p 1). Start-up checks the run against these traits,
and the placement and the weight sync take the engine as they take the built-ins (docs/architecture.md,
"Extension points"; ``tests/test_engine_plugin.py``).
"""

from __future__ import annotations

from rlinf_search.workers.rollout.base import engine_traits
from rlinf_search.workers.rollout.hf_engine import build_hf_engine


@engine_traits(offloads_on=frozenset({"cuda"}), filtered_logprobs=True)
def build(config, *, device=None, seed=0):
    """``factory(RolloutConfig, *, device, seed) -> GenerationEngine``, the contract of ``ROLLOUT_ENGINES``."""
    return build_hf_engine(config, device=device, seed=seed)

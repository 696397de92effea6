"""The actor's memory plan per GPU, as code: the rules docs/recipes.md's table is computed from, and the check
that stops an actor rank whose update cannot fit its GPU before it loads anything.

    python -m toolkits.memory_plan --shape qwen2.5-3b --ranks 8 --mbs-tokens 8192 --reference

The rules were fitted to exact tensor bytes measured by ``benchmarks/actor_memory.py`` on Qwen2.5-0.5B's
shape (FSDP2, bf16 compute over fp32 master weights, checkpointing, packed rows, chunked log-probs) at
one and two ranks; that benchmark prints the plan beside each measured peak.
``benchmarks/gpu_actor_step.py`` prints this plan beside the GPU's measured peak, and
``tests/test_gpu.py`` holds the two within 10 % on a CUDA machine (on an H200: FSDP2 at the 3B shape 1.4 %
above the plan, Megatron 8 %; docs/history/benchmarks.md section 7).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024 ** 3


@dataclass(frozen=True)
class MemoryPlan:
    """Planned bytes per GPU of one PPO update of the actor (FSDP2 with every memory saver on)."""

    state: float
    """fp32 parameters, gradients and AdamW's two moments: 16 B a parameter, sharded over the ranks."""
    reference: float
    """The reference model, bf16 and sharded (0 without KL)."""
    checkpoints: float
    """Layer-boundary activations checkpointing keeps: tokens x hidden x 4 B x layers."""
    lm_head_peak: float
    """The peak phase, the LM head's backward: the gathered embedding (fp32 and bf16) and its unsharded
    gradient (10 B an embedding parameter; at one rank only the bf16 copy, 2 B, as the fp32 parameter and
    gradient are the shard itself), and one chunk's logits and their gradient (14 B each)."""

    @property
    def total(self) -> float:
        """The training peak: every part above at once."""
        return self.state + self.reference + self.checkpoints + self.lm_head_peak


def plan_actor_memory(config, *, ranks: int, mbs_tokens: int, chunk_tokens: int = 1024,
                      reference: bool = False, backend: str = "fsdp", tensor_parallel: int = 1) -> MemoryPlan:
    """The plan for a model of ``config`` (a transformers config of a decoder LM with tied or untied
    embeddings), ``ranks`` ranks, micro-batches of ``mbs_tokens`` tokens and LM-head chunks of
    ``chunk_tokens``. ``backend: megatron`` (a first estimate, not yet fitted to a measurement): bf16
    parameters and an fp32 gradient buffer per tensor-parallel shard (6 B a parameter), fp32 main weights
    and Adam moments split over the data-parallel ranks (12 B), bf16 layer inputs kept by full recompute,
    and the micro-batch's full-vocabulary bf16 logits and their gradient beside the scorer's chunk."""
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = hidden // heads
    attention = hidden * hidden * 2 + hidden * kv_heads * head_dim * 2 + hidden + 2 * kv_heads * head_dim
    per_layer = attention + 3 * hidden * config.intermediate_size + 2 * hidden
    embedding = vocab * hidden
    params = embedding * (1 if config.tie_word_embeddings else 2) + layers * per_layer + hidden
    if backend == "megatron":
        return MemoryPlan(state=6 * params / tensor_parallel + 12 * params / ranks,
                          reference=(2 * params / tensor_parallel) if reference else 0.0,
                          checkpoints=mbs_tokens * hidden * 2 * layers,
                          lm_head_peak=4 * mbs_tokens * vocab + 14 * min(chunk_tokens, mbs_tokens) * vocab)
    return MemoryPlan(state=16 * params / ranks, reference=(2 * params / ranks) if reference else 0.0,
                      checkpoints=mbs_tokens * hidden * 4 * layers,
                      lm_head_peak=(10 if ranks > 1 else 2) * embedding + 14 * min(chunk_tokens, mbs_tokens) * vocab)


def plan_exceeds_device(config, *, ranks: int, device_bytes: int) -> str | None:
    """One line when one update of the actor ``config`` (an ``ActorConfig``) on ``ranks`` ranks needs more than
    ``device_bytes`` by the plan, else None. The plan is the optimistic case (checkpointing on, every saver), so
    a run it refuses would run out of memory anyway; it says nothing without ``runner.max_tokens_per_mbs`` (no
    micro-batch size to plan for) or with FSDP2's ``cpu_offload`` (the shards live in host memory)."""
    from transformers import AutoConfig

    if config.max_tokens_per_mbs is None or config.fsdp_cpu_offload:
        return None
    shape = AutoConfig.from_pretrained(config.model_path)
    megatron = config.training_backend == "megatron"
    tensor_parallel = config.megatron.tensor_model_parallel_size if megatron else 1
    # ddp keeps a whole copy a rank: the one-rank plan.
    sharded_over = 1 if config.training_backend == "ddp" else ranks // tensor_parallel
    plan = plan_actor_memory(shape, ranks=sharded_over, mbs_tokens=config.max_tokens_per_mbs,
                             chunk_tokens=config.logprob_chunk_tokens, reference=config.loss.kl_beta > 0,
                             backend="megatron" if megatron else "fsdp", tensor_parallel=tensor_parallel)
    if plan.total <= device_bytes:
        return None
    return (f"actor memory plan: one update needs about {plan.total / GIB:.1f} GiB a GPU even with every memory "
            f"saver (state {plan.state / GIB:.1f}, reference {plan.reference / GIB:.1f}, activations "
            f"{plan.checkpoints / GIB:.1f}, LM head {plan.lm_head_peak / GIB:.1f}) and this GPU has "
            f"{device_bytes / GIB:.1f} GiB; lower runner.max_tokens_per_mbs, give the actor more GPUs, or set "
            "actor.fsdp_config.cpu_offload: true")

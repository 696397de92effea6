"""A Megatron-core ``GPTModel`` with the Qwen2 architecture, built from a HF config and loaded with HF weights.

Imports megatron-core: only the Megatron backend (and its tests) load this module. Construction and
weight loading run on CPU (``use_cpu_initialization``); megatron-core's forward pass expects CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

from rlinf_search.workers.actor.megatron.config import MegatronConfig
from rlinf_search.workers.actor.megatron.weights import (
    QwenLayout,
    StateDict,
    hf_to_megatron,
    megatron_to_hf,
    merge_tensor_parallel,
    shard_tensor_parallel,
)


def read_layout(model_path: str | Path) -> QwenLayout:
    """The layout of the HF model at ``model_path`` (its ``config.json``)."""
    return QwenLayout.from_hf_config(json.loads((Path(model_path) / "config.json").read_text()))


def init_model_parallel(config: MegatronConfig, *, seed: int) -> None:
    """Split the (already initialised) default process group into tensor/data-parallel groups."""
    if not dist.is_initialized():
        raise RuntimeError("init_model_parallel needs torch.distributed initialised first")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=config.tensor_model_parallel_size,
                                                 pipeline_model_parallel_size=config.pipeline_model_parallel_size,
                                                 distributed_timeout_minutes=config.distributed_timeout_minutes)
    if torch.cuda.is_available():
        # Dropout inside a tensor-parallel region draws from this tracked generator.
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(layout: QwenLayout, config: MegatronConfig, *, dtype: torch.dtype) -> TransformerConfig:
    """Qwen2 in Megatron's terms: RMSNorm, SwiGLU without linear biases, qkv bias, GQA, no dropout."""
    on_gpu = torch.cuda.is_available()
    return TransformerConfig(
        num_layers=layout.num_layers, hidden_size=layout.hidden_size, ffn_hidden_size=layout.intermediate_size,
        num_attention_heads=layout.num_heads, num_query_groups=layout.num_kv_heads, kv_channels=layout.head_dim,
        normalization="RMSNorm", layernorm_epsilon=layout.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=layout.qkv_bias,
        # RL fine-tuning of an instruct model: dropout off, as in the HF model's config.
        hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=config.tensor_model_parallel_size,
        pipeline_model_parallel_size=config.pipeline_model_parallel_size,
        sequence_parallel=config.sequence_parallel,
        recompute_granularity=config.recompute_granularity, recompute_method=config.recompute_method,
        recompute_num_layers=config.recompute_num_layers,
        params_dtype=dtype, bf16=dtype == torch.bfloat16, pipeline_dtype=dtype,
        attention_softmax_in_fp32=True,
        # The fused kernels are CUDA extensions (Apex/TE); the plain torch paths run everywhere.
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        # Initialisation is overwritten by the HF weights, but it is also where Megatron tags each
        # weight as tensor-parallel or replicated (what the gradient norm and optimizers read).
        use_cpu_initialization=not on_gpu, perform_initialization=True,
    )


def layer_spec(core_attention: str):
    """megatron-core's local layer spec (plain torch modules: needs neither Transformer Engine nor Apex), its core
    attention the local ``DotProductAttention`` or ``sdpa_attention.SdpaCoreAttention``."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if core_attention == "sdpa":
        from rlinf_search.workers.actor.megatron.sdpa_attention import SdpaCoreAttention

        spec.submodules.self_attention.submodules.core_attention = SdpaCoreAttention
    return spec


def build_gpt_model(layout: QwenLayout, config: MegatronConfig, *, dtype: torch.dtype = torch.float32) -> GPTModel:
    """This rank's shard of an (uninitialised) Qwen2 ``GPTModel``; load weights next."""
    layout.check_tensor_parallel(config.tensor_model_parallel_size)
    return GPTModel(
        config=transformer_config(layout, config, dtype=dtype),
        transformer_layer_spec=layer_spec(config.core_attention),
        vocab_size=layout.padded_vocab_size(config.tensor_model_parallel_size),
        max_sequence_length=layout.max_position_embeddings, position_embedding_type="rope",
        rotary_base=layout.rope_theta, share_embeddings_and_output_weights=layout.tie_word_embeddings,
        # Full-vocabulary logits on every tensor-parallel rank, so the policy loss is the FSDP one.
        parallel_output=False, pre_process=True, post_process=True)


def load_hf_weights(model: GPTModel, hf_state: StateDict, layout: QwenLayout, *, tensor_parallel_size: int,
                    tensor_parallel_rank: int) -> None:
    """Copy a HF Qwen2 state dict into this rank's shard of ``model``; every tensor must be used."""
    if layout.tie_word_embeddings:
        hf_state = {k: v for k, v in hf_state.items() if k != "lm_head.weight"}
    whole = hf_to_megatron(hf_state, layout, padded_vocab=layout.padded_vocab_size(tensor_parallel_size))
    shard = shard_tensor_parallel(whole, tensor_parallel_size)[tensor_parallel_rank]
    own = {name: tensor for name, tensor in model.state_dict().items() if not name.endswith("_extra_state")}
    if set(own) != set(shard):
        extra, missing = sorted(set(shard) - set(own)), sorted(set(own) - set(shard))
        raise ValueError(f"HF -> Megatron mapping mismatch: unexpected {extra[:3]}, missing {missing[:3]}")
    for name, tensor in shard.items():
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{name}: Megatron shape {tuple(own[name].shape)}, mapped HF shape {tuple(tensor.shape)}")
    model.load_state_dict(shard, strict=False)  # strict=False only for the _extra_state entries


def gather_hf_weights(model: GPTModel, layout: QwenLayout) -> StateDict:
    """The whole model as a HF state dict, on every rank (a collective over the tensor-parallel group)."""
    local = {name: t.detach() for name, t in model.state_dict().items() if not name.endswith("_extra_state")}
    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        shards = [local]
    else:
        group = parallel_state.get_tensor_model_parallel_group()
        shards = [{} for _ in range(size)]
        for name, tensor in local.items():
            pieces = [torch.empty_like(tensor) for _ in range(size)]
            dist.all_gather(pieces, tensor.contiguous(), group=group)
            for shard, piece in zip(shards, pieces):
                shard[name] = piece
    hf = megatron_to_hf(merge_tensor_parallel(shards), layout)
    return {name: tensor.to("cpu", copy=True) for name, tensor in hf.items()}


class MegatronCausalLM(torch.nn.Module):
    """A ``GPTModel`` called like a HF causal LM: ``model(input_ids=, attention_mask=, position_ids=).logits``.

    So the policy trainer's log-prob and loss code is the FSDP backend's, unchanged. Given ``positions`` (flat
    indices into ``input_ids``: the positions that predict a scored token), the LM head runs on those alone and the
    logits are ``[positions, vocab]``: a Search-R1 row is mostly prompt and retrieved passages, whose full-vocabulary
    logits nobody reads (at 0.5B and 4 rows of about 1k tokens the head on every position was 60 % more work than
    the rest of the update).
    """

    picks_positions = True
    """``TokenScorer`` passes the predicting positions to ``forward``."""

    def __init__(self, gpt: GPTModel, layout: QwenLayout):
        super().__init__()
        self.gpt = gpt
        self.layout = layout

    def forward(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                positions: torch.Tensor | None = None) -> CausalLMLogits:
        length = input_ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
        keep = causal[None] & attention_mask.bool()[:, None, :]
        hook = None
        if positions is not None:
            def pick(module, args, kwargs):  # the head's input [s, b, h] -> the predicting positions, [K, 1, h]
                hidden = args[0]
                rows = hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])  # (row, position) order, as input_ids
                return (rows[positions].unsqueeze(1), *args[1:]), kwargs

            hook = getattr(self.gpt, "module", self.gpt).output_layer.register_forward_pre_hook(pick, with_kwargs=True)
        try:
            # Megatron's mask marks what to hide: [batch, 1, query, key], True = masked out.
            logits = self.gpt(input_ids, position_ids, ~keep[:, None])
        finally:
            if hook is not None:
                hook.remove()
        if positions is not None:
            logits = logits[0]  # [1, K, vocab] -> [K, vocab]
        # Padded vocabulary rows are not tokens: leave them out of the softmax.
        return CausalLMLogits(logits=logits[..., : self.layout.vocab_size])


class CausalLMLogits:
    """The one field of a HF ``CausalLMOutput`` the trainer reads."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

"""Qwen2 weights between Hugging Face and Megatron-core layouts, and Megatron's parallel shards.

Plain torch (no megatron-core), so the checkpoint converter runs anywhere. The layouts:

- attention: HF has ``q_proj``/``k_proj``/``v_proj``; Megatron one ``linear_qkv`` whose rows are
  grouped per key/value head: for each group, its ``heads/groups`` query heads, then its key head,
  then its value head. Megatron's ``get_query_key_value_tensors`` views the rows that way, and a
  tensor-parallel rank owns whole groups, so a plain row split of the fused tensor shards it.
- MLP: Megatron's ``linear_fc1`` is ``[gate; up]`` (SwiGLU chunks its output in two, gate first).
  Each tensor-parallel rank holds ``[gate_r; up_r]``, so fc1 shards gate and up separately.
- column-parallel tensors (qkv, fc1, embedding, output layer) split rows; row-parallel ones
  (``linear_proj``, ``linear_fc2``) split columns; norms are replicated.
- Megatron-LM pads the vocabulary (to a multiple of 128 x tensor-parallel size); the padded rows
  are cut off on the way to HF and zero-filled on the way in.
- Transformer Engine layer specs fuse the norms into the next linear (``linear_qkv.layer_norm_weight``);
  those names are read as the local spec's ``input_layernorm`` / ``pre_mlp_layernorm``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

StateDict = dict[str, torch.Tensor]

# Megatron-LM's default --make-vocab-size-divisible-by.
VOCAB_DIVISOR = 128
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# Transformer Engine spec names -> the local spec's names.
_TE_ALIASES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
               "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}
_COLUMN_PARALLEL = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")


@dataclass(frozen=True)
class QwenLayout:
    """The shape facts of a Qwen2-architecture model that the weight mapping needs."""

    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Width of the residual stream."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention: ``num_heads`` is a multiple of it)."""
    head_dim: int
    """Width of one head."""
    intermediate_size: int
    """MLP width (of gate and of up, each)."""
    vocab_size: int
    """Vocabulary of the HF model (Megatron may hold more rows: padding)."""
    tie_word_embeddings: bool
    """The output layer reuses the input embedding."""
    rope_theta: float
    """RoPE base."""
    rms_norm_eps: float
    """RMSNorm epsilon."""
    max_position_embeddings: int
    """Longest sequence the model was built for."""
    qkv_bias: bool = True
    """q/k/v projections have biases (Qwen2 yes, Llama by ``attention_bias``)."""

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> QwenLayout:
        """From a ``config.json`` dict; rejects what the mapping would get wrong, in one line."""
        arch = config.get("model_type")
        if arch not in ("qwen2", "llama"):
            raise ValueError(f"model_type {arch!r} is not supported; the Megatron mapping covers qwen2 (and llama)")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported; "
                             "only plain RoPE maps to Megatron's rotary embedding here")
        if config.get("use_sliding_window"):
            raise ValueError("use_sliding_window: true is not supported by the Megatron backend")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config['hidden_act']!r} is not supported; Qwen2 uses silu (SwiGLU)")
        heads = int(config["num_attention_heads"])
        return cls(num_layers=int(config["num_hidden_layers"]), hidden_size=int(config["hidden_size"]),
                   num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
                   intermediate_size=int(config["intermediate_size"]), vocab_size=int(config["vocab_size"]),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   rope_theta=float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                   qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)))

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab_size(self, tensor_parallel: int, divisor: int = VOCAB_DIVISOR) -> int:
        """Megatron-LM's padded vocabulary: the next multiple of ``divisor * tensor_parallel``."""
        step = divisor * tensor_parallel
        return -(-self.vocab_size // step) * step

    def check_tensor_parallel(self, tensor_parallel: int) -> None:
        """Tensor parallelism splits whole key/value groups and the MLP width evenly."""
        for what, value in (("num_key_value_heads", self.num_kv_heads), ("intermediate_size", self.intermediate_size)):
            if value % tensor_parallel:
                raise ValueError(f"tensor_model_parallel_size {tensor_parallel} must divide {what} ({value})")


# ---- HF <-> Megatron (whole model, no parallel split) -------------------------------------------
def hf_to_megatron(hf: StateDict, layout: QwenLayout, *, padded_vocab: int | None = None) -> StateDict:
    """A HF Qwen2 state dict as a Megatron-core ``GPTModel`` state dict (local layer spec)."""
    out: StateDict = {"embedding.word_embeddings.weight": _pad_rows(hf["model.embed_tokens.weight"], padded_vocab)}
    g, hd = layout.num_kv_heads, layout.head_dim
    for i in range(layout.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
            parts = [hf[f"{src}self_attn.{p}_proj.{kind}"] for p in "qkv"]
            # [q; k; v] -> per group [q heads of the group; k; v]
            q, k, v = (t.reshape(g, -1, hd, *t.shape[1:]) for t in parts)
            out[f"{dst}self_attention.linear_qkv.{kind}"] = torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[3:])
        out[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        gate, up = hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not layout.tie_word_embeddings:
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], padded_vocab)
    return out


def megatron_to_hf(mcore: StateDict, layout: QwenLayout) -> StateDict:
    """A merged Megatron ``GPTModel`` state dict (either layer spec) as a HF Qwen2 state dict."""
    mcore = normalize_names(mcore)
    out: StateDict = {"model.embed_tokens.weight": mcore["embedding.word_embeddings.weight"][: layout.vocab_size]}
    g, hd, per = layout.num_kv_heads, layout.head_dim, layout.heads_per_group
    for i in range(layout.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = mcore[src + "input_layernorm.weight"]
        for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
            fused = mcore[f"{src}self_attention.linear_qkv.{kind}"]
            grouped = fused.reshape(g, per + 2, hd, *fused.shape[1:])
            q, k, v = grouped.split([per, 1, 1], dim=1)
            for name, part in zip("qkv", (q, k, v)):
                out[f"{dst}self_attn.{name}_proj.{kind}"] = part.reshape(-1, *fused.shape[1:])
        out[dst + "self_attn.o_proj.weight"] = mcore[src + "self_attention.linear_proj.weight"]
        out[dst + "post_attention_layernorm.weight"] = mcore[src + "pre_mlp_layernorm.weight"]
        gate, up = mcore[src + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
        out[dst + "mlp.down_proj.weight"] = mcore[src + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = mcore["decoder.final_layernorm.weight"]
    if not layout.tie_word_embeddings:
        out["lm_head.weight"] = mcore["output_layer.weight"][: layout.vocab_size]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def normalize_names(mcore: StateDict) -> StateDict:
    """Drop ``_extra_state`` entries and read Transformer Engine names as the local spec's."""
    out: StateDict = {}
    for name, tensor in mcore.items():
        if name.endswith("_extra_state") or not isinstance(tensor, torch.Tensor):
            continue
        match = _LAYER.match(name)
        if match and match.group(2) in _TE_ALIASES:
            name = f"decoder.layers.{match.group(1)}.{_TE_ALIASES[match.group(2)]}"
        out[name] = tensor
    return out


def _pad_rows(tensor: torch.Tensor, rows: int | None) -> torch.Tensor:
    if rows is None or rows == tensor.shape[0]:
        return tensor
    if rows < tensor.shape[0]:
        raise ValueError(f"padded vocabulary {rows} is smaller than the model's {tensor.shape[0]}")
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


# ---- tensor parallel ------------------------------------------------------------------------------
def _split_dim(name: str) -> int | None:
    """The dimension tensor parallelism splits ``name`` along (None: replicated)."""
    suffix = _LAYER.match(name).group(2) if _LAYER.match(name) else name
    if suffix in _COLUMN_PARALLEL or suffix in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return 0
    if suffix in _ROW_PARALLEL:
        return 1
    return None


def shard_tensor_parallel(mcore: StateDict, tensor_parallel: int) -> list[StateDict]:
    """Split a whole-model Megatron state dict into the ``tensor_parallel`` ranks' shards."""
    shards: list[StateDict] = [{} for _ in range(tensor_parallel)]
    for name, tensor in normalize_names(mcore).items():
        if name.endswith("mlp.linear_fc1.weight"):
            gates, ups = (part.chunk(tensor_parallel, dim=0) for part in tensor.chunk(2, dim=0))
            pieces = [torch.cat([gate, up]) for gate, up in zip(gates, ups)]
        elif (dim := _split_dim(name)) is not None:
            if tensor.shape[dim] % tensor_parallel:
                raise ValueError(f"{name}: dimension {dim} ({tensor.shape[dim]}) does not split into "
                                 f"{tensor_parallel} tensor-parallel shards")
            pieces = list(tensor.chunk(tensor_parallel, dim=dim))
        else:
            pieces = [tensor] * tensor_parallel
        for shard, piece in zip(shards, pieces):
            shard[name] = piece.clone()
    return shards


def merge_tensor_parallel(shards: list[StateDict]) -> StateDict:
    """Join the tensor-parallel ranks' shards (rank order) into one whole-model state dict."""
    shards = [normalize_names(shard) for shard in shards]
    names = set(shards[0])
    for rank, shard in enumerate(shards[1:], start=1):
        if set(shard) != names:
            missing = sorted(names ^ set(shard))[0]
            raise ValueError(f"tensor-parallel rank {rank} and rank 0 hold different tensors (e.g. {missing})")
    out: StateDict = {}
    for name in shards[0]:
        pieces = [shard[name] for shard in shards]
        if name.endswith("mlp.linear_fc1.weight"):
            halves = [piece.chunk(2, dim=0) for piece in pieces]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        elif (dim := _split_dim(name)) is not None:
            out[name] = torch.cat(pieces, dim=dim)
        else:
            out[name] = pieces[0]
    return out


# ---- pipeline parallel ----------------------------------------------------------------------------
def merge_pipeline_stages(stages: list[StateDict]) -> StateDict:
    """Join pipeline stages (stage order): each numbers its layers from 0, so renumber them in turn."""
    out: StateDict = {}
    offset = 0
    for stage in stages:
        stage_layers = set()
        for name, tensor in normalize_names(stage).items():
            match = _LAYER.match(name)
            if match is None:
                # With tied embeddings the last stage holds a copy of the embedding as output_layer.
                out.setdefault(name, tensor)
                continue
            layer = int(match.group(1))
            stage_layers.add(layer)
            out[f"decoder.layers.{layer + offset}.{match.group(2)}"] = tensor
        offset += len(stage_layers)
    return out


def split_pipeline_stages(mcore: StateDict, pipeline_parallel: int, num_layers: int) -> list[StateDict]:
    """Split into ``pipeline_parallel`` stages of equal layer counts, as Megatron numbers them."""
    if num_layers % pipeline_parallel:
        raise ValueError(f"pipeline_model_parallel_size {pipeline_parallel} must divide num_layers ({num_layers})")
    per_stage = num_layers // pipeline_parallel
    stages: list[StateDict] = [{} for _ in range(pipeline_parallel)]
    for name, tensor in normalize_names(mcore).items():
        match = _LAYER.match(name)
        if match:
            layer = int(match.group(1))
            stages[layer // per_stage][f"decoder.layers.{layer % per_stage}.{match.group(2)}"] = tensor
        elif name.startswith("embedding."):
            stages[0][name] = tensor
        else:  # final norm and output layer
            stages[-1][name] = tensor
    return stages

"""Log-probs (and entropy) of response tokens without the whole micro-batch's fp32 logits in memory.

Two things keep activation memory near the model's own:

- **Packing** (``actor.model.use_remove_padding``): a micro-batch's rows are laid end to end in one
  sequence whose ``position_ids`` restart at 0 for every row, with no attention mask. transformers then
  attends within each row by the position ids (``sdpa_varlen``, ``packed_attention.py``; flash attention
  reads them as cumulative lengths; flex attention builds a block mask from them), so each row attends only
  to itself, as when padded, and no padding token is computed.
- **Chunking** (``actor.model.logprob_chunk_size``): only the hidden states that predict a response token
  go through the LM head, a chunk of tokens at a time; in training each chunk is checkpointed, so its
  ``[chunk, vocab]`` fp32 logits exist once, briefly, instead of 3 to 4 full-size copies kept for backward.
  Entropy gets a gradient only when its loss coefficient is not 0; otherwise it is measured without one.

Every component scores tokens as the engine sampled them: ``log_softmax(logits / T)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from rlinf_search.data.batch import RolloutBatch
from rlinf_search.workers.actor.hf_model import PACKED_ROW_KERNELS
from rlinf_search.workers.actor.shared_prompts import shared_prompt_layout

log = logging.getLogger(__name__)

DEFAULT_CHUNK_TOKENS = 1024
"""Response tokens per LM-head chunk: at Qwen2.5's 151,936-token vocabulary a chunk's fp32 logits are
about 0.6 GB, a small fraction of an 80 GB GPU, and the matmul is still large enough to run at speed."""


@dataclass
class ScoringLayout:
    """A micro-batch laid out for one forward pass, and where its response tokens are."""

    input_ids: torch.Tensor
    """[1, N] packed rows, [B, P + T] padded ones, or [G, W] one sequence per prompt shared by its rows."""
    position_ids: torch.Tensor
    """Same shape: positions restarting at 0 for every row (for shared prompts: each response's restart after its
    prompt)."""
    attention_mask: torch.Tensor | None
    """[B, P + T] for the padded layout, [G, 1, W, W] (True: may attend) for prompts shared by their rows; None when
    packed (the position ids mark the rows)."""
    predictors: torch.Tensor
    """[K] flat indices (into ``input_ids.view(-1)``) of the positions whose output predicts a response token."""
    targets: torch.Tensor
    """[K] the response tokens."""
    rows: torch.Tensor
    """[K] each target's row in the micro-batch."""
    cols: torch.Tensor
    """[K] each target's column in the ``[B, T]`` response tensors."""
    shape: tuple[int, int]
    """(B, T) of the micro-batch's response tensors."""
    candidates: torch.Tensor | None = None
    """[K, k] further tokens to score at each target's position (the distillation teacher's top-k), or None."""

    def to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """[K] (or [K, k]) per-target values scattered into a zero ``[B, T]`` (``[B, T, k]``) tensor
        (differentiable)."""
        out = values.new_zeros(self.shape + tuple(values.shape[1:]))
        return out.index_put((self.rows, self.cols), values)


def packs_rows(model: torch.nn.Module, requested: bool) -> bool:
    """Whether to lay a micro-batch's rows end to end (``requested``: ``use_remove_padding``). Only a kernel that
    attends within each packed row (``hf_model.PACKED_ROW_KERNELS``: ``sdpa_varlen``, flash, flex) gains from it:
    sdpa and eager get a dense block-diagonal mask over the whole packed sequence, so attention costs the square of
    the micro-batch's token count, not the sum of its rows' squares (3x slower than padding for 32 rows of 200
    tokens on a CPU). Those keep the rows padded, with one warning."""
    if not requested:
        return False
    config = getattr(model, "config", None)
    implementation = str(getattr(config, "_attn_implementation", None) or "")
    if implementation in PACKED_ROW_KERNELS:
        return True
    log.warning("use_remove_padding: the model's %s attention has no kernel for packed rows (it would attend over "
                "the whole packed micro-batch), so rows stay padded; load it with sdpa_varlen (or flash or flex "
                "attention) to pack", implementation or "default")
    return False


def layout_batch(batch: RolloutBatch, *, packed: bool, model_tokens_only: bool = False,
                 share_prompts: bool = False) -> ScoringLayout:
    """``batch``'s real tokens, packed into one sequence, left padded, or (``share_prompts``, not packed) each
    prompt once with its rows' responses after it (``shared_prompts.py``), and its response targets: every real
    response token, or with ``model_tokens_only`` the model's own (``response_mask`` 1). The policy's losses and
    metrics read model tokens alone, and in a Search-R1 trajectory most response tokens are retrieved passages,
    so scoring only model tokens keeps most positions out of the LM head (a 150k-wide matmul on a real model)."""
    p, t = batch.prompt_length, batch.response_length
    attention = batch.attention_mask.bool()
    real_response = scored = attention[:, p: p + t]
    if model_tokens_only and bool((real_response & batch.response_mask.bool()).any()):
        # A pass with no model token (a rank's padding pass) keeps its whole response: the backward must still
        # reach every parameter, as on the other ranks, whose collectives it joins.
        scored = real_response & batch.response_mask.bool()
    rows, cols = scored.nonzero(as_tuple=True)
    targets = batch.input_ids[:, p: p + t][rows, cols]
    candidates = batch.teacher_top_ids[rows, cols] if batch.teacher_top_ids is not None else None
    if share_prompts and not packed:
        ids, positions, mask, predictors = shared_prompt_layout(batch, real_response, rows, cols)
        return ScoringLayout(ids, positions, mask, predictors, targets, rows, cols, (len(batch), t), candidates)
    if not packed:
        width = batch.input_ids.shape[1]
        positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        return ScoringLayout(batch.input_ids, positions, batch.attention_mask, rows * width + (p - 1) + cols,
                             targets, rows, cols, (len(batch), t), candidates)
    starts = attention.long().argmax(dim=1)  # first real (prompt) token of each row
    lengths = attention.sum(dim=1)
    offsets = torch.cumsum(lengths, 0) - lengths
    ids = torch.cat([batch.input_ids[i, starts[i]: starts[i] + lengths[i]] for i in range(len(batch))])
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    prompt_lengths = p - starts
    predictors = offsets[rows] + prompt_lengths[rows] - 1 + cols
    return ScoringLayout(ids.unsqueeze(0), positions.unsqueeze(0), None, predictors, targets, rows, cols,
                         (len(batch), t), candidates)


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                entropy_grad: bool, candidates: torch.Tensor | None = None, with_entropy: bool = True):
    logits = head(hidden).float() / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser

    def entropy() -> torch.Tensor:
        return normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)

    if not with_entropy:  # a softmax over the vocabulary per token saved (old and reference log-prob passes)
        ent = None
    elif entropy_grad:
        ent = entropy()
    else:
        with torch.no_grad():
            ent = entropy()
    if candidates is None:
        return logprobs, ent
    return logprobs, ent, logits.gather(-1, candidates) - normaliser.unsqueeze(-1)


class ScoredTokens(NamedTuple):
    """What ``TokenScorer`` gives for a layout's targets, in its order (a named tuple: FSDP and DDP find the
    tensors of a module's output by walking tuples)."""

    logprobs: torch.Tensor
    """[K] log-prob of each target."""
    entropy: torch.Tensor | None
    """[K] entropy of the distribution each target was drawn from (a gradient only when asked for); None when
    not asked for (``with_entropy=False``)."""
    candidate_logprobs: torch.Tensor | None
    """[K, k] log-probs of the layout's ``candidates`` at each target's position, or None."""


def chunked_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float,
                     chunk_tokens: int, entropy_grad: bool, candidates: torch.Tensor | None = None,
                     with_entropy: bool = True) -> ScoredTokens:
    """Log-probs and entropy of ``targets`` (and of ``candidates``, [K, k]) from their predicting ``hidden``
    states ([K, H]), ``chunk_tokens`` at a time; with gradients on, each chunk's logits are recomputed in
    backward instead of kept."""
    parts: list[tuple[torch.Tensor, ...]] = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        stop = start + chunk_tokens
        args = (head, hidden[start:stop], targets[start:stop], temperature, entropy_grad,
                None if candidates is None else candidates[start:stop], with_entropy)
        if torch.is_grad_enabled():
            parts.append(checkpoint(_head_chunk, *args, use_reentrant=False))
        else:
            parts.append(_head_chunk(*args))
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logprobs = torch.cat([part[0] for part in parts]) if parts else empty
    entropy = (torch.cat([part[1] for part in parts]) if parts else empty) if with_entropy else None
    chosen = None
    if candidates is not None:
        chosen = torch.cat([part[2] for part in parts]) if parts else hidden.new_zeros((0, candidates.shape[1]),
                                                                                        dtype=torch.float32)
    return ScoredTokens(logprobs, entropy, chosen)


class TokenScorer(torch.nn.Module):
    """A causal LM's response-token log-probs and entropy for a ``ScoringLayout``.

    It is the module data parallelism wraps (FSDP's root, or DDP's module): the LM head is used inside its
    forward, where FSDP has the root's parameters gathered. A model without a separate head
    (``get_output_embeddings``) is scored from its logits instead: at the predicting positions alone when it
    takes them (``picks_positions``: the Megatron wrapper), else from every position's.
    """

    def __init__(self, lm: torch.nn.Module, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
        self._split_head = head is not None and hasattr(lm, "base_model") and lm.base_model is not lm

    def forward(self, layout: ScoringLayout, *, temperature: float = 1.0, entropy_grad: bool = False,
                with_entropy: bool = True) -> ScoredTokens:
        """Log-probs and (``with_entropy``) entropy of the layout's targets (and of its candidates), in its order."""
        device = layout.input_ids.device
        candidates = None if layout.candidates is None else layout.candidates.to(device)
        kwargs = dict(input_ids=layout.input_ids, position_ids=layout.position_ids, attention_mask=layout.attention_mask)
        if self._split_head:
            hidden = self.lm.base_model(**kwargs, use_cache=False).last_hidden_state
            picked = hidden.reshape(-1, hidden.shape[-1])[layout.predictors.to(device)]
            return chunked_logprobs(self.lm.get_output_embeddings(), picked, layout.targets.to(device),
                                    temperature=temperature, chunk_tokens=self.chunk_tokens, entropy_grad=entropy_grad,
                                    candidates=candidates, with_entropy=with_entropy)
        if getattr(self.lm, "picks_positions", False):  # the head runs on the predicting positions alone
            picked = self.lm(**kwargs, positions=layout.predictors.to(device)).logits
        else:
            logits = self.lm(**kwargs).logits
            picked = logits.reshape(-1, logits.shape[-1])[layout.predictors.to(device)]
        return chunked_logprobs(torch.nn.Identity(), picked, layout.targets.to(device), temperature=temperature,
                                chunk_tokens=self.chunk_tokens, entropy_grad=entropy_grad, candidates=candidates,
                                with_entropy=with_entropy)


def to_device(layout: ScoringLayout, device: torch.device | str) -> ScoringLayout:
    """The layout's model inputs on ``device`` (index tensors follow when used)."""
    mask = None if layout.attention_mask is None else layout.attention_mask.to(device)
    candidates = None if layout.candidates is None else layout.candidates.to(device)
    return ScoringLayout(layout.input_ids.to(device), layout.position_ids.to(device), mask,
                         layout.predictors.to(device), layout.targets.to(device), layout.rows.to(device),
                         layout.cols.to(device), layout.shape, candidates)

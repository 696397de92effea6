"""The FLOPs of one actor update, by where they go: what ``benchmarks/gpu_actor_step.py`` divides by time for MFU.

Only matrix products are counted (norms, activations, the softmax are a rounding error at these shapes), each as
2 FLOPs a multiply-add, and a backward pass as twice its forward:

- **layers**: 6 x the decoder layers' projection weights (q, k, v, o, gate, up, down) x the batch's real tokens;
- **attention**: 12 x layers x attention width (heads x head dim) x the sum over rows of length squared. The
  causal mask is not halved (PaLM's and Megatron's convention; a kernel that skips masked blocks runs faster than
  this counts), and a row attends to itself only (packed or padded, padding is not useful work);
- **head**: 6 x hidden x vocabulary x the scored tokens only. The policy loss reads the model's own response tokens,
  so the actor sends only those through the LM head (``token_scoring.layout_batch``); charging the head to every
  token, as ``6 x parameters x tokens`` does, overstates a Search-R1 update's work. The embedding lookup is no matmul.
- **recompute**: what checkpointing runs once more in backward, not useful work. ``recompute="layers"`` (the HF
  backends' ``gradient_checkpointing``): each decoder layer's forward but its MLP down projection, which torch's
  non-reentrant checkpoint never reruns (it stops once the tensors backward needs are back, and nothing needs that
  last product); ``"full"`` (Megatron's full recompute): each layer's whole forward; ``"none"``. And under the HF
  backends the LM head's forward on every scored token always (each head chunk is checkpointed,
  ``token_scoring.chunked_logprobs``).
- **unscored head**: the head on positions nobody reads (``head_positions`` beyond the scored tokens): a model
  scored from every position's full-vocabulary logits. The Megatron wrapper did so until it took the predicting
  positions (``MegatronCausalLM.picks_positions``); it now runs the head on the scored tokens, unchecked.

MFU divides ``useful`` by time and the GPU's peak; ``executed`` (all of it) gives the hardware FLOPs
utilisation. ``tests/test_update_flops.py`` holds this count against torch's ``FlopCounterMode`` on a real update.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateFlops:
    """FLOPs of one forward and backward over a batch, by part."""

    layers: float
    """The decoder layers' projections, forward and backward."""
    attention: float
    """Scores and their weighted sum, forward and backward, the causal mask not halved."""
    head: float
    """The LM head on the scored tokens, forward and backward."""
    recompute: float
    """Forward passes checkpointing runs a second time (not useful work)."""
    unscored_head: float = 0.0
    """The LM head on positions whose logits no loss reads (not useful work)."""

    @property
    def useful(self) -> float:
        """What MFU counts."""
        return self.layers + self.attention + self.head

    @property
    def executed(self) -> float:
        """What the GPU ran: useful work and the recompute (hardware FLOPs utilisation counts this)."""
        return self.useful + self.recompute + self.unscored_head


FORMULA = ("useful FLOPs = 6 x layer projection weights x tokens + 12 x layers x attention width x sum(row length^2) "
           "+ 6 x hidden x vocab x scored tokens (the causal mask not halved); HFU adds the recompute and the head "
           "on unscored positions")
"""The count in one line, printed beside each result."""


def layer_projection_weights(config) -> int:
    """Weights of one decoder layer's matmuls (a HF Qwen2/Llama-style config): attention and gated MLP."""
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    query = config.num_attention_heads * head_dim
    key_value = config.num_key_value_heads * head_dim
    return hidden * query + 2 * hidden * key_value + query * hidden + 3 * hidden * config.intermediate_size


RECOMPUTE = ("none", "layers", "full")
"""What a backend recomputes in backward: nothing, the HF backends' checkpointed layers, Megatron's full layers."""


def update_flops(config, *, row_lengths: list[int], scored_tokens: int, recompute: str = "none",
                 head_positions: int | None = None) -> UpdateFlops:
    """FLOPs of one forward and backward of the rows ``row_lengths`` (real tokens each) under ``config``, with
    ``scored_tokens`` read by the loss. ``head_positions``: the positions the head runs on when that is every
    position of the micro-batches (the Megatron wrapper), else None (the scored tokens alone, each chunk
    checkpointed)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    layers, hidden = config.num_hidden_layers, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    width = config.num_attention_heads * head_dim
    tokens = sum(row_lengths)
    projections = 6.0 * layers * layer_projection_weights(config) * tokens
    attention = 12.0 * layers * width * sum(n * n for n in row_lengths)
    head = 6.0 * hidden * config.vocab_size * scored_tokens
    again = 0.0
    if recompute == "full":
        again = (projections + attention) / 3
    elif recompute == "layers":  # all but each layer's down projection (torch's checkpoint stops before it)
        again = (projections + attention) / 3 - 2.0 * layers * hidden * config.intermediate_size * tokens
    if head_positions is None:
        again += head / 3
        unscored = 0.0
    else:
        unscored = 6.0 * hidden * config.vocab_size * (head_positions - scored_tokens)
    return UpdateFlops(layers=projections, attention=attention, head=head, recompute=again, unscored_head=unscored)


def scored_tokens(batch) -> int:
    """The tokens of a ``RolloutBatch`` the policy loss reads: its model's own response tokens."""
    return int((batch.response_mask.bool() & batch.attention_mask[:, batch.prompt_length:].bool()).sum())


def batch_flops(config, batch, *, recompute: str = "none", head_positions: int | None = None) -> UpdateFlops:
    """``update_flops`` of a ``RolloutBatch``: its rows' real tokens, its model tokens scored."""
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]
    return update_flops(config, row_lengths=lengths, scored_tokens=scored_tokens(batch), recompute=recompute,
                        head_positions=head_positions)

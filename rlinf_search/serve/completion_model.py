"""A Hugging Face causal LM behind the completions API: log-probs of given tokens, and sampling.

CPU users and the tests serve a teacher with it; on GPUs ``vllm serve`` takes its place behind the same
API (``examples/searchr1/start_teacher_server.sh``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlinf_search.workers.rollout.hf_cache import cache_kwargs, returned_cache


@dataclass
class SampledToken:
    """One generated token."""

    id: int
    """The token id."""
    logprob: float
    """Its log-prob under the model's own distribution (temperature 1), as vLLM reports it."""
    top: list[tuple[int, float]]
    """The most likely (id, log-prob) at its position, when asked for; else empty."""


@dataclass
class ScoredText:
    """A token sequence with each token's log-prob given the ones before it, and its place in the text."""

    ids: list[int]
    """The tokens, prompt first."""
    tokens: list[str]
    """Each token as text (what the completions API's ``logprobs.tokens`` holds)."""
    logprobs: list[float | None]
    """Log-prob of each token given the ones before; None for the first (nothing conditions it)."""
    offsets: list[int]
    """Character offset of each token in ``text`` (``logprobs.text_offset``)."""
    text: str
    """The decoded sequence."""


GREEDY_BELOW = 1e-5
"""Temperatures below this sample greedily (as vLLM does): dividing the logits by 1e-300 overflows to inf."""


class CompletionModel:
    """One model and its tokenizer; calls are serialised by the server (one forward at a time)."""

    def __init__(self, model_path: str, *, dtype: str = "auto", device: str | None = None):
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(self.device).eval()
        self.max_length = int(getattr(self.model.config, "max_position_embeddings", 32768))
        ends = getattr(self.model.generation_config, "eos_token_id", None) or self.tokenizer.eos_token_id
        self.end_ids = frozenset(ends if isinstance(ends, list) else [ends]) - {None}
        """Tokens that end a generation: the generation config's end tokens (Qwen's ``<|im_end|>`` and
        ``<|endoftext|>``), else the tokenizer's EOS."""

    def encode(self, text: str, *, special_tokens: bool = False) -> list[int]:
        """``text``'s ids; ``special_tokens``: with the tokenizer's own (a BOS), as vLLM encodes a text prompt."""
        return self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"]

    @torch.no_grad()
    def score(self, ids: list[int], *, temperature: float,
              top_k: int = 0) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
        """Log-prob of each of ``ids`` given the ones before it, from ``logits / temperature``; and with
        ``top_k`` > 0 the ``top_k`` most likely (id, log-prob) at each position (None for the first)."""
        if len(ids) > self.max_length:
            raise ValueError(f"{len(ids)} tokens exceed the model's {self.max_length}")
        if len(ids) < 2:
            return [None] * len(ids), [None] * len(ids)
        batch = torch.tensor([ids], device=self.device)
        logits = self.model(input_ids=batch).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        chosen = logprobs.gather(1, batch[0, 1:, None])[:, 0]
        top: list[list[tuple[int, float]] | None] = [None] * len(ids)
        if top_k > 0:
            values, indices = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
            top = [None] + [list(zip(row_ids, row_values)) for row_ids, row_values
                            in zip(indices.tolist(), values.tolist())]
        return [None] + chosen.tolist(), top

    def sample(self, ids: list[int], *, max_tokens: int, temperature: float, seed: int | None) -> list[int]:
        """Up to ``max_tokens`` new tokens after ``ids`` (greedy below ``GREEDY_BELOW``), stopping at EOS."""
        return [t.id for t in self.generate(ids, max_tokens=max_tokens, temperature=temperature, seed=seed)]

    @torch.no_grad()
    def generate(self, ids: list[int], *, max_tokens: int, temperature: float, seed: int | None,
                 top_logprobs: int = 0, ignore_eos: bool = False) -> Iterator[SampledToken]:
        """The new tokens after ``ids`` one at a time, as they are sampled (greedy below ``GREEDY_BELOW``), until
        ``max_tokens`` or an end token (unless ``ignore_eos``). The caller stops it early by no longer iterating
        (a client gone, a stop string): nothing runs between two tokens it did not ask for."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else torch.seed())
        sequence = torch.tensor([ids], device=self.device)
        past = None
        for _ in range(max_tokens):
            result = self.model(input_ids=sequence if past is None else sequence[:, -1:],
                                **cache_kwargs(self.model, past), use_cache=True)
            past, logits = returned_cache(result), result.logits[0, -1].float()
            if temperature < GREEDY_BELOW:
                token = int(logits.argmax())
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            # The model's own distribution, whatever the temperature (as vLLM reports log-probs).
            logprobs = torch.log_softmax(logits, dim=-1)
            top = []
            if top_logprobs > 0:
                values, indices = logprobs.topk(min(top_logprobs, logprobs.shape[-1]))
                top = list(zip(indices.tolist(), values.tolist()))
            yield SampledToken(id=token, logprob=float(logprobs[token]), top=top)
            if token in self.end_ids and not ignore_eos:
                return
            sequence = torch.cat([sequence, torch.tensor([[token]], device=self.device)], dim=1)

    def describe(self, ids: list[int], logprobs: list[float | None]) -> ScoredText:
        """Tokens as text and their character offsets in the decoded sequence (a token whose bytes
        complete a character later starts where that character does)."""
        tokens, offsets, previous = [], [], ""
        for end in range(1, len(ids) + 1):
            prefix = self.tokenizer.decode(ids[:end])
            stable = prefix.rstrip("\ufffd")  # a partial UTF-8 character decodes as U+FFFD until complete
            offsets.append(len(previous))
            tokens.append(self.tokenizer.decode(ids[end - 1:end]))
            previous = stable
        return ScoredText(ids=ids, tokens=tokens, logprobs=logprobs, offsets=offsets,
                          text=self.tokenizer.decode(ids))

"""An engine that replays fixed turn texts: exact expectations for agent-loop tests and tool debugging.

It follows the engine contract (stop strings end a turn right after the stop; ``max_new_tokens``
truncates), so the agent loop cannot tell it from a model that happened to write these turns.
"""

from __future__ import annotations

import asyncio

from rlinf_search.data.io_struct import GenerationOutput, SamplingParams
from rlinf_search.workers.weight_loading import weight_buckets


class ScriptedEngine:
    """Answers the n-th ``generate`` call of a prompt with the n-th scripted turn text.

    A turn that contains a stop string ends right after it (``stop``); one that ends with the EOS
    token's text ends ``eos``; any other ends ``length``. Turns are counted per distinct first
    prompt, so script one trajectory per prompt.
    """

    def __init__(self, tokenizer, turns: list[str], *, logprob: float = -0.5, delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.logprob = logprob
        self.delay_s = delay_s  # stands in for generation time, so rollouts overlap as they would

        self.weight_version = 0
        self.calls: list[tuple[list[int], SamplingParams]] = []
        self._next_turn: dict[tuple[int, ...], int] = {}
        self._first_prompt: dict[tuple[int, ...], tuple[int, ...]] = {}

    def _turn_index(self, prompt_ids: list[int]) -> int:
        # A continuation of a trajectory starts with that trajectory's first prompt; count per prompt.
        for first in self._first_prompt:
            if tuple(prompt_ids[: len(first)]) == first:
                index = self._next_turn[first]
                self._next_turn[first] = index + 1
                return index
        key = tuple(prompt_ids)
        self._first_prompt[key] = key
        self._next_turn[key] = 1
        return 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        self.calls.append((list(prompt_ids), sampling))
        index = self._turn_index(prompt_ids)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if index >= len(self.turns):
            raise RuntimeError(f"script has {len(self.turns)} turns; turn {index + 1} was asked for")
        text, finish, stop_string = self.turns[index], "length", None
        hits = [(text.index(s) + len(s), s) for s in sampling.stop if s in text]
        if hits:
            end, stop_string = min(hits)
            text, finish = text[:end], "stop"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > sampling.max_new_tokens:
            ids, finish, stop_string = ids[: sampling.max_new_tokens], "length", None
        elif finish != "stop" and sampling.stop_at_eos and ids and ids[-1] == self.tokenizer.eos_token_id:
            finish = "eos"  # the scripted text ended with the EOS token's text
        return GenerationOutput(ids, [self.logprob] * len(ids), finish, stop_string)

    def update_weights(self, weights) -> None:
        for _ in weight_buckets(weights):  # a streamed sync waits for every bucket to be taken
            pass
        self.weight_version += 1

    def offload(self) -> None:
        pass

    def onload(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


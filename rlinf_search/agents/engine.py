"""What an agent loop needs from the engine that generates its turns, the checks every engine makes of a request,
and the two helpers every engine side shares with it: a trajectory's routing session and the derivation of
per-request seeds.

They live here, in the agents' floor, so that agent loops import nothing from the workers: the workers (the
rollout ranks, the engine servers, the router) import them from here.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from rlinf_search.data.io_struct import GenerationOutput, SamplingParams


class GenerationEngine(Protocol):
    """What the agent loop and the trainer need from any rollout engine (hf, vllm, sglang, a router over servers)."""

    tokenizer: object
    """The model's tokenizer (a Hugging Face tokenizer): the agent loop encodes prompts and observations with it."""

    weight_version: int
    """Bumped by every ``update_weights`` (the engine's own count). The version trajectories record is the weight
    sync's, stamped on each output by the rank's ``WeightGate`` (``workers/rollout/weight_gate.py``), not this."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        """Continue ``prompt_ids``; return exactly the sampled ids and their log-probs (one version: the caller's
        gate never swaps weights while a request runs)."""
        ...

    def update_weights(self, weights) -> None:
        """Load new policy weights (names as in the Hugging Face model): a state dict, or an iterable of buckets
        (partial state dicts, each valid until the next is taken) to load as they arrive and take to the end."""
        ...

    def offload(self) -> None:
        """Free the device memory the engine holds (collocated training needs it)."""
        ...

    def onload(self) -> None:
        """Bring the engine back after ``offload``."""
        ...

    async def aclose(self) -> None:
        """Stop background work and release resources."""
        ...


def check_request(prompt_ids: list[int], sampling: SamplingParams, *, positions: int, offloaded: bool) -> None:
    """The checks every engine's ``generate`` makes before it queues a request: a ``RuntimeError`` while offloaded,
    a one-line ``ValueError`` for an empty prompt, one longer than the model's ``positions`` with its new tokens, or
    sampling that cannot run."""
    if offloaded:
        raise RuntimeError("the engine is offloaded; call onload() before generate()")
    if not prompt_ids:
        raise ValueError("generate() needs at least one prompt token")
    if len(prompt_ids) + sampling.max_new_tokens > positions:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_new_tokens {sampling.max_new_tokens} "
                         f"exceeds the engine's {positions} positions")
    if sampling.max_new_tokens < 1 or (not sampling.greedy and sampling.temperature <= 0):
        raise ValueError(f"invalid sampling parameters {sampling}: max_new_tokens must be >= 1 and "
                         "temperature > 0 unless greedy")


@dataclass
class RouteSession:
    """One trajectory's routing state: the engine its first turn went to."""

    engine: int | None = None
    """The engine serving this trajectory (set by the first request); None before it."""


TRAJECTORY: ContextVar[RouteSession | None] = ContextVar("rlinf_search_trajectory", default=None)
"""The trajectory whose turn is being generated: set by the agent loop around each rollout (an asyncio task
of its own), read by a router over several engines. None: each request is routed on its own."""


@contextmanager
def routed_trajectory():
    """The requests made inside are turns of one trajectory (a fresh ``RouteSession``); engines that are not
    routed ignore it."""
    token = TRAJECTORY.set(RouteSession())
    try:
        yield
    finally:
        TRAJECTORY.reset(token)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from its parts (a call's seed, a trajectory's index, a turn); stable across
    processes, unlike ``hash()`` of a string."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1

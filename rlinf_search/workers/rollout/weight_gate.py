"""The weight gate: new weights reach an engine at a token boundary, and every token records the policy that sampled it.

In an asynchronous run (``runner.pipeline: async``) a rollout rank keeps generating while the actor trains,
and the weight sync arrives on another thread of the rank. The gate makes the hand-over exact for any engine
(hf, vLLM, a user's):

- every ``generate`` enters the gate, and each of its tokens is stamped with the policy version that sampled it;
- ``swap(load, version, abort)`` closes the gate to new requests and, when the engine can abort (``abort_all``:
  the hf and vLLM engines), ends the requests in flight at their next token boundary. It then loads the weights
  and opens the gate again. An aborted request keeps the tokens it has; ``GatedEngine`` sends it again as the
  prompt plus those tokens, so it continues on the new weights after one prefill (as in slime and AReaL's
  interruptible generation). The sender waits one decode step, not a whole turn.
- an engine without ``abort_all`` is drained instead: the requests in flight finish their turns on the weights
  they started with (at most one turn of decoding), then the load.

So a trajectory in flight when new weights arrive continues on them (a partial rollout, ``runner.partial_rollout``),
inside a turn where the engine can abort, else at its next turn. The gate also counts how long the engine had work,
for the engine-idle metric, and how long each swap waited for the requests in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlinf_search.agents.engine import derive_seed
from rlinf_search.data.io_struct import GenerationOutput, SamplingParams

SWAP_TIMEOUT_S = 600.0
"""Longest a swap waits for the requests in flight (a turn of decoding, normally seconds)."""
ABORT_REPEAT_S = 0.05
"""While requests are still in flight after an abort, the swap aborts again this often."""


@dataclass(frozen=True)
class EngineActivity:
    """What an engine's gate has counted since the rank started."""

    version: int
    """The policy version loaded now (the last weight sync's, 0 before the first)."""
    busy_s: float
    """Seconds with at least one request in flight (the engine had work)."""
    requests: int
    """Generate requests admitted."""
    in_flight: int
    """Requests running now."""
    swaps: int = 0
    """Weight swaps done."""
    swap_wait_s: float = 0.0
    """Seconds the swaps waited for the requests in flight (to abort, or to finish their turns), in total: what the
    sender of a weight sync waits beyond the load itself."""
    aborted: int = 0
    """Requests ended at a token boundary by a swap, to continue on the new weights."""


class WeightGate:
    """Admits generate requests, and swaps weights only while none is in flight. Thread-safe: requests come
    from any event loop (every rollout call of a rank runs its own), swaps from another thread."""

    def __init__(self, version: int = 0):
        self._version = version
        self._cond = threading.Condition()
        self._swap_lock = threading.Lock()
        self._open = True
        self._in_flight = 0
        self._requests = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self._swaps = 0
        self._swap_wait_s = 0.0
        self._aborted = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def is_open(self) -> bool:
        """False while a swap waits for the requests in flight or loads."""
        return self._open

    async def enter(self) -> int:
        """Wait until the gate is open, count a request in flight, and return the version it runs on."""
        while True:
            with self._cond:
                if self._open:
                    self._in_flight += 1
                    self._requests += 1
                    if self._in_flight == 1:
                        self._busy_since = time.perf_counter()
                    return self._version
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiters.append((loop, future))
            await future

    def leave(self) -> None:
        """The request ``enter`` counted has finished (or failed)."""
        with self._cond:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_s += time.perf_counter() - self._busy_since
                self._busy_since = None
                self._cond.notify_all()

    def count_aborted(self) -> None:
        """A request in flight was ended by ``abort`` (``GatedEngine`` counts it)."""
        with self._cond:
            self._aborted += 1

    def swap(self, load: Callable[[], None], version: int, *, abort: Callable[[], None] | None = None,
             timeout_s: float = SWAP_TIMEOUT_S) -> None:
        """Close the gate, end the requests in flight (``abort()``, which makes the engine answer them at their next
        token boundary) or wait for them to finish (None), ``load()`` the new weights, record ``version`` and
        reopen. Call it from a thread that is not running requests of its own (the rank's weight-sync thread):
        it blocks until they have left."""
        with self._swap_lock:
            started = time.perf_counter()
            with self._cond:
                self._open = False
                busy = self._in_flight > 0
            if busy and abort is not None:
                abort()
            with self._cond:
                if abort is None:
                    drained = self._cond.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)
                else:
                    # A request that entered just before the gate closed may reach the engine after the abort:
                    # abort again until none is left (the gate is closed, so only old requests are ended).
                    deadline = started + timeout_s
                    while not (drained := self._in_flight == 0) and time.perf_counter() < deadline:
                        if not self._cond.wait_for(lambda: self._in_flight == 0, timeout=ABORT_REPEAT_S):
                            abort()  # returns at once; the requests leave through the gate's lock as it waits
                self._swaps += 1
                self._swap_wait_s += time.perf_counter() - started
            try:
                if not drained:
                    raise RuntimeError(f"weight swap to version {version}: {self._in_flight} generate requests were "
                                       f"still running after {timeout_s:.0f} s; was the swap called from the thread "
                                       "that runs them?")
                load()
                with self._cond:
                    self._version = version
            finally:
                with self._cond:
                    self._open = True
                    waiters, self._waiters = self._waiters, []
                for loop, future in waiters:
                    loop.call_soon_threadsafe(_release, future)

    def activity(self) -> EngineActivity:
        with self._cond:
            busy = self._busy_s + (time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0)
            return EngineActivity(version=self._version, busy_s=busy, requests=self._requests,
                                  in_flight=self._in_flight, swaps=self._swaps, swap_wait_s=self._swap_wait_s,
                                  aborted=self._aborted)


def _release(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class GatedEngine:
    """An engine seen through a ``WeightGate``: ``generate`` waits while weights are being swapped, stamps every
    token with the version that sampled it, and continues a request a swap aborted on the new weights; everything
    else (``tokenizer``, offload...) is the engine's own."""

    def __init__(self, engine, gate: WeightGate, *, interrupt: bool = True):
        """``interrupt``: a swap aborts the requests in flight when the engine can (``abort_all``); False drains
        them (each finishes its turn on the old weights first)."""
        self._engine, self._gate = engine, gate
        abort = getattr(engine, "abort_all", None)
        self._abort = abort if interrupt and callable(abort) else None

    @property
    def interrupts(self) -> bool:
        """A swap ends the requests in flight at a token boundary (else it waits for their turns to finish)."""
        return self._abort is not None

    def load_weights(self, weights, version: int) -> None:
        """Swap the engine's weights for ``weights`` (a state dict or buckets of one) as policy ``version``."""
        self._gate.swap(lambda: self._engine.update_weights(weights), version, abort=self._abort)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationOutput:
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        while True:
            version = await self._gate.enter()
            try:
                out = await self._engine.generate(list(prompt_ids) + ids, _rest_of(sampling, len(ids)))
            finally:
                self._gate.leave()
            boundary = len(ids)
            ids += out.output_ids
            logprobs += out.logprobs
            versions += [version] * len(out.output_ids)
            finish, stop_string = out.finish_reason, out.stop_string
            # The engine that continued saw only its own tokens: a stop string begun before the abort is found here.
            cut = _stop_across(self._engine.tokenizer, ids, boundary, sampling.stop) if boundary and sampling.stop \
                else None
            if cut is not None:
                (end, stop_string), finish = cut, "stop"
                ids, logprobs, versions = ids[:end], logprobs[:end], versions[:end]
                break
            if finish != "abort":
                break
            self._gate.count_aborted()
            if len(ids) >= sampling.max_new_tokens:  # an engine that checks the limit after the abort
                finish, stop_string = "length", None
                break
        return GenerationOutput(ids, logprobs, finish, stop_string, weight_version=min(versions, default=version),
                                token_versions=versions)

    @property
    def weight_version(self) -> int:
        return self._gate.version

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


def _rest_of(sampling: SamplingParams, done: int) -> SamplingParams:
    """The sampling of a request continued after ``done`` tokens: the tokens left, and a seed of its own (the
    first seed again would replay the first draws)."""
    if not done:
        return sampling
    seed = None if sampling.seed is None else derive_seed(sampling.seed, "continued", done)
    return replace(sampling, max_new_tokens=sampling.max_new_tokens - done, seed=seed)


def _stop_across(tokenizer, ids: list[int], boundary: int, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """A stop string that began before an abort's ``boundary`` and completed after it: the engine that continued
    saw only the new tokens, so it missed it. Returns (tokens to keep, the stop string) or None."""
    window = max(len(stop) for stop in stops) + 1  # every token carries at least one character
    head = ids[max(0, boundary - window): boundary]
    for k in range(1, min(window, len(ids) - boundary) + 1):
        text = tokenizer.decode(head + ids[boundary: boundary + k])
        for stop in stops:
            if stop in text:
                return boundary + k, stop
    return None

"""Calling a remote service without letting it stall or stop a run: a concurrency cap, a rate limit,
a limit per attempt, retries with jittered backoff and a deadline over all of it.

The search client and the distillation teacher client both call through ``RetryingCaller``; each
formats the ``CallFailed`` it gets into its own one-line message.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from rlinf_search.net.http import FinalBackendError, TransientBackendError

T = TypeVar("T")


class TokenBucket:
    """Async token bucket: ``rate`` requests per second, at most ``burst`` back to back.

    Every ``acquire`` takes a token at once, letting the balance go negative, and then sleeps until
    the balance it left would have refilled. That queues callers first come, first served, with no
    lock and no polling.
    """

    def __init__(self, rate_per_s: float, *, burst: float = 1.0):
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._updated = time.monotonic()

    def _reserve(self) -> float:
        """Take one token; return how long the caller must wait before using it."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now
        self._tokens -= 1.0
        return max(0.0, -self._tokens / self.rate_per_s)

    async def acquire(self) -> None:
        """Wait for this caller's turn."""
        wait_s = self._reserve()
        if wait_s > 0:
            await asyncio.sleep(wait_s)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a client may push a service, and how long it waits for it."""

    timeout_s: float
    """Limit on one attempt."""
    max_retries: int
    """Retries after the first attempt on ``TransientBackendError`` (timeouts, connection errors, 5xx, 429)."""
    backoff_base_s: float
    """First retry waits up to this long; each later one up to twice the previous (full jitter)."""
    backoff_max_s: float
    """Cap on a single backoff wait."""
    max_concurrency: int
    """Attempts in flight at once."""
    rate_limit_per_s: float
    """Attempts started per second (token bucket); 0 means unlimited."""


class CallFailed(Exception):
    """Every attempt failed, a final error came back, or the deadline passed."""

    def __init__(self, *, attempts: int, last: TransientBackendError | None, final: FinalBackendError | None = None,
                 deadline_passed: bool = False):
        super().__init__(final.reason if final else (f"{last.what} ({last.cause})" if last else "deadline passed"))
        self.attempts = attempts
        """Attempts started."""
        self.last = last
        """The last retryable failure, if any."""
        self.final = final
        """The failure retrying cannot fix, if that ended the call."""
        self.deadline_passed = deadline_passed
        """The call's deadline ended it (``last`` says what the attempts before it met)."""


class RetryingCaller:
    """Runs attempts under one policy. One caller belongs to one event loop (its semaphore does)."""

    def __init__(self, policy: RetryPolicy, *, rng: random.Random | None = None,
                 on_attempt: Callable[[bool], None] | None = None):
        self.policy = policy
        self._semaphore = asyncio.Semaphore(policy.max_concurrency)
        self._bucket = TokenBucket(policy.rate_limit_per_s) if policy.rate_limit_per_s > 0 else None
        self._rng = rng or random.Random()
        self._on_attempt = on_attempt

    async def call(self, attempt: Callable[[], Awaitable[T]], *, deadline: float | None = None,
                   deadline_s: float | None = None) -> T:
        """``attempt()``'s result, retried on ``TransientBackendError`` until ``max_retries`` retries or the
        deadline; raises ``CallFailed`` when no attempt succeeds. The deadline is the loop time ``deadline``,
        or ``deadline_s`` seconds from when the first attempt holds its concurrency slot (and rate-limit
        token): a call queued behind many others is not charged for the queue."""
        if (deadline is None) == (deadline_s is None):
            raise ValueError("RetryingCaller.call takes one of deadline and deadline_s")
        attempts, last = 0, None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline) as timeout:
                def start_clock() -> None:
                    if deadline_s is not None and timeout.when() is None:
                        timeout.reschedule(loop.time() + deadline_s)

                while True:
                    attempts += 1
                    try:
                        return await self._attempt(attempt, is_retry=attempts > 1, started=start_clock)
                    except TransientBackendError as exc:
                        last = exc
                    if attempts > self.policy.max_retries:
                        raise CallFailed(attempts=attempts, last=last)
                    await asyncio.sleep(self.backoff_s(attempts))
        except FinalBackendError as exc:
            raise CallFailed(attempts=attempts, last=last, final=exc) from None
        except TimeoutError:
            raise CallFailed(attempts=attempts, last=last, deadline_passed=True) from None

    async def _attempt(self, attempt: Callable[[], Awaitable[T]], *, is_retry: bool,
                       started: Callable[[], None] | None = None) -> T:
        timeout_s = self.policy.timeout_s
        async with self._semaphore:
            if self._bucket is not None:
                await self._bucket.acquire()
            if started is not None:
                started()
            if self._on_attempt is not None:
                self._on_attempt(is_retry)
            try:
                async with asyncio.timeout(timeout_s):
                    return await attempt()
            except TimeoutError:
                raise TransientBackendError("timed out", f"no answer in {timeout_s:g} s") from None

    def backoff_s(self, attempts: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2^(attempts-1))]."""
        ceiling = min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2 ** (attempts - 1))
        return self._rng.uniform(0.0, ceiling)

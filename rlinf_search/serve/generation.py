"""One generation as the server runs it: tokens from the model's thread to the event loop as they are sampled,
cut at a stop string, and stopped the moment nobody wants more (the client gone, a stop string met).

The model runs on one worker thread (one generation at a time); the event loop only relays. A client that
disconnects sets ``gone``, and the worker stops before its next token, so the next request does not wait for
a generation nobody reads (it waited 39.7 s before).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from dataclasses import dataclass, field

from rlinf_search.serve.completion_model import CompletionModel, SampledToken


@dataclass
class GenerationParams:
    """How one choice is generated."""

    max_tokens: int
    """Most new tokens."""
    temperature: float
    """Sampling temperature (greedy below ``GREEDY_BELOW``)."""
    seed: int | None
    """The choice's own seed; None: fresh randomness."""
    stops: tuple[str, ...] = ()
    """Stop strings: the text ends before the first one that appears (not included), finish reason ``stop``."""
    top_logprobs: int = 0
    """The most likely tokens to report at each position (chat ``top_logprobs``)."""
    ignore_eos: bool = False
    """Go on past end tokens (vLLM's ``ignore_eos``)."""


@dataclass
class TextDelta:
    """What one step of a generation adds for the client."""

    text: str
    """New text, safe to send: no stop string can start inside it."""
    tokens: list[SampledToken] = field(default_factory=list)
    """The tokens behind it (their log-probs)."""


@dataclass
class Finished:
    """How a generation ended."""

    reason: str
    """``stop`` (an end token or a stop string) or ``length``."""
    completion_tokens: int
    """Tokens generated."""


class StopText:
    """The decoded text of a generation, released only once no stop string can still begin in it."""

    def __init__(self, model: CompletionModel, stops: tuple[str, ...]):
        self.model, self.stops = model, stops
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False
        self._hold = max((len(s) for s in stops), default=1) - 1

    def push(self, token: int) -> str:
        """Add a token; the text that can go out now (cut before a stop string, which sets ``stopped``)."""
        self.ids.append(token)
        text = self.model.tokenizer.decode(self.ids, skip_special_tokens=True)
        ends = [i for i in (text.find(s, max(0, self.sent - self._hold)) for s in self.stops) if i >= 0]
        if ends:
            self.stopped = True
            return self._release(text, min(ends))
        safe = len(text.rstrip("\ufffd"))  # a partial UTF-8 character decodes as U+FFFD until complete
        return self._release(text, max(self.sent, safe - self._hold))

    def flush(self) -> str:
        """What is left once the generation ends without a stop string."""
        text = self.model.tokenizer.decode(self.ids, skip_special_tokens=True)
        return self._release(text, len(text))

    def _release(self, text: str, end: int) -> str:
        out, self.sent = text[self.sent:end], max(self.sent, end)
        return out


async def generate(model: CompletionModel, executor: Executor, ids: list[int], params: GenerationParams,
                   gone: threading.Event) -> AsyncIterator[TextDelta | Finished]:
    """The generation's text as it comes, then one ``Finished``. Setting ``gone`` (the client left), meeting a stop
    string or closing this iterator stops the model before its next token."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()
    halt = threading.Event()

    def run() -> None:
        try:
            tokens = model.generate(ids, max_tokens=params.max_tokens, temperature=params.temperature,
                                    seed=params.seed, top_logprobs=params.top_logprobs, ignore_eos=params.ignore_eos)
            for token in tokens:
                loop.call_soon_threadsafe(queue.put_nowait, token)
                if halt.is_set() or gone.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop, which raises it there
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)

    worker = loop.run_in_executor(executor, run)
    stop_text = StopText(model, params.stops)
    count = 0
    try:
        while (item := await queue.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            if stop_text.stopped:
                continue  # tokens the worker sampled before it saw the stop
            count += 1
            text = stop_text.push(item.id)
            if stop_text.stopped:
                halt.set()
            yield TextDelta(text, [item])
        if not stop_text.stopped:
            rest = stop_text.flush()
            if rest:
                yield TextDelta(rest)
        ended = stop_text.stopped or bool(stop_text.ids and stop_text.ids[-1] in model.end_ids)
        yield Finished("stop" if ended and not (params.ignore_eos and not stop_text.stopped) else "length", count)
    finally:
        halt.set()
        await worker

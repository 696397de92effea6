"""The request bodies of ``POST /v1/completions`` and ``POST /v1/chat/completions``, as OpenAI's clients send them.

Every field that changes what comes back is either honoured or refused with a 400 naming it (``unsupported``): a
client that asks for ``best_of: 4`` or a ``logit_bias`` must not silently get something else. Fields that change
nothing here (``user``, ``metadata``) are accepted and ignored, as OpenAI's own server does with unknown ones.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from rlinf_search.distill.config import MAX_TOP_K
from rlinf_search.net.serving import ClientError

MAX_CHOICES = 16
"""Most choices (``n``) one request may ask for: each is a full generation."""
MAX_STOPS = 4
"""Most stop strings, as OpenAI allows."""
MAX_TOP_LOGPROBS = 20
"""Most ``top_logprobs`` per token in a chat response, as OpenAI allows."""


class StreamOptions(BaseModel):
    """``stream_options``."""

    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False
    """A last chunk with the usage and no choices."""


class SamplingFields(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # what a torch generator takes
    n: StrictInt = Field(default=1, ge=1, le=MAX_CHOICES)
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    """vLLM's extension: generate ``max_tokens`` whatever end token comes (benchmarks)."""
    # Fields OpenAI defines that this server does not implement: refused when set to anything but their no-op value.
    top_p: float | None = Field(default=None, allow_inf_nan=False)
    presence_penalty: float | None = Field(default=None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, allow_inf_nan=False)
    logit_bias: dict | None = None

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise ClientError(400, f"'stop' takes at most {MAX_STOPS} non-empty strings", param="stop")
        return stops

    def check_supported(self) -> None:
        """Refuse, naming the field, what would otherwise be silently ignored."""
        unsupported = {"top_p": self.top_p not in (None, 1.0), "presence_penalty": self.presence_penalty not in (None, 0.0),
                       "frequency_penalty": self.frequency_penalty not in (None, 0.0), "logit_bias": bool(self.logit_bias)}
        for name, used in unsupported.items():
            if used:
                raise ClientError(400, f"'{name}' is not supported by this server; leave it unset", param=name)
        if self.stream_options is not None and not self.stream:
            raise ClientError(400, "'stream_options' needs 'stream': true", param="stream_options")
        self.stops()


class CompletionRequest(SamplingFields):
    """Body of ``POST /v1/completions``."""

    prompt: StrictStr | list[StrictInt]
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_K)
    return_tokens_as_token_ids: StrictBool = False
    """vLLM's extension: ``top_logprobs`` keys are ``token_id:<id>`` instead of token text (text can be
    ambiguous; ids are what a same-tokenizer client needs)."""
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of is not None and self.best_of != self.n:
            raise ClientError(400, "'best_of' other than 'n' is not supported by this server", param="best_of")
        if self.suffix:
            raise ClientError(400, "'suffix' is not supported by this server", param="suffix")
        scoring = self.logprobs is not None or self.echo
        if scoring and (self.stream or self.stop or self.n > 1):
            field = "stream" if self.stream else "stop" if self.stop else "n"
            raise ClientError(400, f"'logprobs' and 'echo' score the whole sequence here and combine with neither "
                                   f"'stream', 'stop' nor 'n' > 1; drop '{field}'", param=field)


class ChatMessage(BaseModel):
    """One message: ``content`` as text or as OpenAI's text parts."""

    model_config = ConfigDict(extra="ignore")
    role: StrictStr
    content: StrictStr | list[dict] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ClientError(400, "message content parts must be {'type': 'text', 'text': ...}; this server "
                                       "reads text only", param="messages")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)
    tools: list | None = None
    response_format: dict | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise ClientError(400, "'tools' is not supported by this server's chat endpoint", param="tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ClientError(400, "'response_format' other than text is not supported", param="response_format")
        if self.top_logprobs and not self.logprobs:
            raise ClientError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

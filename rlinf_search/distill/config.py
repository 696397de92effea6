"""``algorithm.distill``: on-policy distillation from a teacher behind an OpenAI-compatible server."""

from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import Field, model_validator

from rlinf_search.net.retry import RetryPolicy
from rlinf_search.section_model import ConfigSection, parse_section

MAX_TOP_K = 20
"""vLLM serves at most ``--max-logprobs`` (default 20) log-probs per position."""


class TeacherConfig(ConfigSection):
    """``algorithm.distill.teacher``: where the teacher is served and how hard the client may push it."""

    config_path = "algorithm.distill.teacher"

    base_url: str = "http://127.0.0.1:8001/v1"
    """The server's OpenAI API root (``vllm serve`` and ``python -m rlinf_search.serve`` serve ``/v1``)."""
    model: str = Field("", json_schema_extra={"default_words": "required"})
    """The model name requests carry (``vllm serve``'s ``--served-model-name``, else its path)."""
    tokenizer: str | None = None
    """None: the teacher shares the student's tokenizer and scores the sampled ids as they are (checked
    against the teacher at start-up). A path or name: the teacher's own (fast) tokenizer; the client
    renders the prompt with its chat template, tokenizes prompt and response text with it, and the
    log-probs reach the student's tokens through the cuts both tokenizations share."""
    api_key_env: str = "TEACHER_API_KEY"
    """Environment variable holding the API key (sent as ``Authorization: Bearer``); unset: no key.
    The key never reaches config dumps, logs or errors."""
    proxy: str | None = None
    """A proxy URL for the teacher's requests; None: none, whatever ``HTTP(S)_PROXY`` say (a proxy meant
    for the internet would see the API key and every trajectory)."""
    timeout_s: float = Field(60.0, gt=0)
    """Limit on one request."""
    deadline_s: float = Field(180.0, gt=0)
    """Limit on one trajectory's scoring, retries included, counted from when its first request holds a
    concurrency slot (a wait behind ``max_concurrency`` others is not counted): past it the trajectory
    trains without the signal."""
    max_retries: int = Field(2, ge=0)
    """Retries on timeouts, connection errors, 5xx and 429."""
    backoff_base_s: float = Field(0.5, ge=0)
    """First retry waits up to this long; each later one up to twice the previous (full jitter)."""
    backoff_max_s: float = Field(8.0, ge=0)
    """Cap on a single backoff wait."""
    max_concurrency: int = Field(32, ge=1)
    """Requests in flight at once."""
    rate_limit_per_s: float = Field(0.0, ge=0)
    """Requests started per second; 0 means unlimited."""

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> TeacherConfig:
        return parse_section(cls, dict(section), path="algorithm.distill.teacher")

    @model_validator(mode="after")
    def _check(self) -> TeacherConfig:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"algorithm.distill.teacher.base_url: expected http(s)://host:port/v1, got "
                             f"{self.base_url!r}")
        if self.proxy is not None and not self.proxy.startswith(("http://", "https://", "socks5://")):
            raise ValueError(f"algorithm.distill.teacher.proxy: expected http(s):// or socks5:// URL, got "
                             f"{self.proxy!r}")
        if not self.model:
            raise ValueError("algorithm.distill.teacher.model is required (the name the server serves)")
        return self

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(timeout_s=self.timeout_s, max_retries=self.max_retries,
                           backoff_base_s=self.backoff_base_s, backoff_max_s=self.backoff_max_s,
                           max_concurrency=self.max_concurrency, rate_limit_per_s=self.rate_limit_per_s)


class DistillSettings(ConfigSection):
    """``algorithm.distill``'s keys of the distillation term (the config's section adds ``enable``, the teacher's
    section and ``top_k_divergence``: ``config/model.py``)."""

    config_path = "algorithm.distill"
    mode: Literal["add", "only"] = "add"
    """``add``: the term is added to the GRPO advantage; ``only``: it replaces it."""
    coef: float = Field(1.0, ge=0)
    """Weight of the term ``-coef * KL``, where KL is ``log p_student - log p_teacher`` on a model token.
    0 (with ``mode: add``): the teacher only measures the KL, and the run trains on GRPO alone; the
    baseline of a comparison then logs the same ``distill/*`` curves as the distilled run."""
    discount: float = Field(0.0, ge=0, le=1)
    """Each token's term also sums the following tokens' KL of the same turn, discounted by this (0:
    the token's own KL only; 1: the rest of the turn)."""
    center: bool = True
    """Subtract the batch's mean KL per scored model token before the term is formed (a baseline)."""
    clip: float | None = Field(None, gt=0)
    """Clip each token's term to ``[-clip, clip]``; None: no clip."""
    top_k: int = Field(0, ge=0, le=MAX_TOP_K)
    """0: the sampled-token term only. k > 0: the teacher also sends its k most likely tokens at every
    model token (``logprobs: k``, ids as vLLM's ``return_tokens_as_token_ids`` gives them), and the actor
    adds ``top_k_coef * KL(teacher top-k || student)`` to each token's loss: a dense target that teaches the
    teacher's choice even where the student never samples it. Needs a teacher that shares the student's
    tokenizer; 20 at most (vLLM's default ``--max-logprobs``)."""
    top_k_coef: float = Field(1.0, gt=0)
    """Weight of the top-k KL in the actor's loss (read only with ``top_k`` > 0)."""
    max_failed_fraction: float = Field(0.5, ge=0, le=1)
    """The run stops, with one line, when more than this share of the trajectories of the last
    ``failure_window_steps`` steps got no teacher signal (a teacher that is down for good)."""
    failure_window_steps: int = Field(5, ge=1)
    """Steps the failure share is measured over."""


class DistillConfig(DistillSettings):
    """``algorithm.distill``: how the teacher's per-token signal enters the advantage."""

    teacher: TeacherConfig
    """``algorithm.distill.teacher``."""
    temperature: float = Field(1.0, gt=0, json_schema_extra={"set_from": "algorithm.sampling_params.temperature"})
    """The rollout temperature, at which both log-probs are taken (from ``algorithm.sampling_params``)."""

    @model_validator(mode="after")
    def _check(self) -> DistillConfig:
        if self.coef == 0 and self.mode == "only" and self.top_k == 0:
            raise ValueError("algorithm.distill.coef 0 with mode 'only' would train on nothing; "
                             "use mode 'add' to measure the KL alongside GRPO, or set top_k")
        if self.top_k and self.teacher.tokenizer is not None:
            raise ValueError("algorithm.distill.top_k needs a teacher that shares the student's tokenizer "
                             "(teacher.tokenizer: null): its top tokens are ids of its own vocabulary")
        return self

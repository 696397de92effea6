"""Data that moves between components: prepared QA rows, generation requests and results, trajectories.

Token sequences are plain ``list[int]`` here (one trajectory at a time); batching into tensors
happens where a batch is formed (the trainer), not in these structs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class QARecord:
    """One prepared question, as written by ``rlinf_search.data.prepare`` (one jsonl row)."""

    uid: str
    """Unique across every input file and data source; GRPO groups samples of one prompt by it."""
    prompt: list[dict] | str
    """Chat messages (``[{"role", "content"}]``) or text already in the model's template."""
    golden_answers: list[str]
    """Every accepted answer; a reward compares the model's answer with each."""
    data_source: str
    """Name of the data set the question came from (metrics are reported per source)."""
    question: str = ""
    """The bare question, for logs and evaluation tables."""
    extra: dict = field(default_factory=dict)
    """Anything else the source carried (question type, level, supporting titles)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one generation call samples."""

    max_new_tokens: int = 500
    """Most tokens generated in this call."""
    temperature: float = 1.0
    """Softmax temperature; ignored when ``greedy``."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 keeps every token."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps every token."""
    greedy: bool = False
    """Take the most likely token every step (evaluation)."""
    stop: tuple[str, ...] = ()
    """Generation ends once the generated text contains any of these strings."""
    stop_at_eos: bool = True
    """End on the tokenizer's EOS token (and the model's other end tokens)."""
    seed: int | None = None
    """This request's own sampling seed: its draws then depend on the seed alone, not on which other
    requests share the batch, so a rollout replays exactly whatever the admission order. None: the
    engine's shared generator."""


@dataclass
class GenerationOutput:
    """What an engine returns for one request: exactly the sampled ids, and their log-probs."""

    output_ids: list[int]
    """The sampled token ids, unchanged, up to and including the token that completed a stop."""
    logprobs: list[float]
    """Log-prob of each sampled id under the temperature-scaled distribution (same length)."""
    finish_reason: str
    """``stop`` (a stop string appeared), ``eos`` (an end token) or ``length`` (max_new_tokens); from an engine
    itself also ``abort`` (``abort_all`` ended it at a token boundary: the ids so far), which the rank's weight gate
    continues on the new weights and never hands on."""
    stop_string: str | None = None
    """Which stop string ended the generation, when ``finish_reason == "stop"``."""
    weight_version: int | None = None
    """The oldest policy version (weight syncs loaded) that sampled any of these ids, stamped by the rank's weight
    gate (``workers/rollout/weight_gate.py``). None: an engine that does not count versions."""
    token_versions: list[int] | None = None
    """The policy version that sampled each id (same length as ``output_ids``): a request a weight swap aborted
    continues on the new weights, so one turn can hold two versions. None: an engine that does not count them."""


SPAN_KINDS = ("model", "information", "correction", "tool")


@dataclass(frozen=True)
class ResponseSpan:
    """A run of response tokens with one origin: ``response_ids[start:end]``."""

    kind: str
    """``model`` (the policy wrote it; mask 1), ``information`` (a search result) or ``correction``
    (the note after a turn with no valid action); the last two are observations, mask 0."""
    start: int
    """First token's index in ``response_ids``."""
    end: int
    """One past the last token's index."""
    text: str = ""
    """The span's tokens decoded (filled in when the rollout ends), for rollout files and logs."""
    weight_version: int | None = None
    """``model`` spans: the oldest policy version that sampled any of the turn's tokens
    (``GenerationOutput.weight_version``); None for observations, or when the engine does not count versions.
    ``Trajectory.token_versions`` has each token's."""


@dataclass
class Trajectory:
    """One multi-turn rollout of one prompt: what the trainer learns from.

    ``response_ids``, ``response_mask`` and ``rollout_logprobs`` have the same length: every token
    after the prompt, model-generated and observation alike, in order.
    """

    uid: str
    """The prompt's uid (shared by the group of samples of one prompt)."""
    prompt_ids: list[int]
    """Token ids of the templated prompt."""
    response_ids: list[int]
    """Every token after the prompt: model turns and observations, interleaved."""
    response_mask: list[int]
    """1 for model-generated tokens (trained on), 0 for observation tokens (masked out of the loss)."""
    rollout_logprobs: list[float]
    """The engine's log-prob per response token; 0.0 on observation tokens. NaN on model tokens whose
    ids were re-tokenized (``retokenize: true``), since the engine never scored those ids."""
    token_versions: list[int] = field(default_factory=list)
    """The policy version that sampled each response token (``GenerationOutput.token_versions``); -1 on
    observation tokens and where the engine does not count versions. Empty: not recorded (a trajectory built
    outside the agent loop); otherwise as long as ``response_ids``."""
    num_searches: int = 0
    """Searches issued (valid ``<search>`` actions)."""
    queries: list[str] = field(default_factory=list)
    """The search queries, in order."""
    search_errors: int = 0
    """Searches whose backend failed (the model saw an error observation)."""
    infra_error: str | None = None
    """The first tool failure that was the infrastructure's, not the model's (``ToolResult.infra_error``: a server
    unreachable, timed out or failing after its retries). The trajectory ended there (``finish_reason``
    ``infra_error``) and is never trained or scored: its group is rolled out again, or dropped from the step."""
    infra_reruns: int = 0
    """Times its group was rolled out again after an infrastructure failure before this sample was kept."""
    num_turns: int = 0
    """Generation calls made."""
    finish_reason: str = ""
    """``answer``, ``eos``, ``max_turns``, ``max_response_tokens``, ``length`` or ``infra_error``."""
    drifted: bool = False
    """Re-tokenizing the decoded text would give other ids than the sampled ones (measured either way)."""
    tool_call_errors: int = 0
    """Tool calls the model wrote that could not run (``toolcall`` protocol: bad JSON, an unknown tool, missing
    arguments); each got an error message as its tool response."""
    tool_calls: dict[str, int] = field(default_factory=dict)
    """Calls run per tool name (``search``, ``access``, a user's)."""
    tool_errors: dict[str, int] = field(default_factory=dict)
    """Failed calls per ``<tool>/<kind>`` (``search/arguments``, ``search/backend``, ...)."""
    template_drift: bool = False
    """``toolcall``: re-rendering the conversation as chat messages through the template gives other ids than
    the trajectory's (what a pipeline that re-tokenizes messages would train on; measured, never used)."""
    data_source: str = ""
    """Copied from the prompt's record, for per-source metrics."""
    golden_answers: list[str] = field(default_factory=list)
    """Copied from the prompt's record, for the reward."""
    spans: list[ResponseSpan] = field(default_factory=list)
    """The response cut into model and observation spans, in order; together they cover ``response_ids``."""
    response_text: str = ""
    """``response_ids`` decoded: the full response, observations included."""
    graded_text: str = ""
    """What rewards read: the model's spans as written, observations with every protocol tag taken out
    (search results keep their ``<information>`` wrapper), so only the model's tags can be an answer."""
    generation_time_s: float = 0.0
    """Wall time spent waiting for the engine."""
    tool_time_s: float = 0.0
    """Wall time spent waiting for the search tool."""
    total_time_s: float = 0.0
    """Wall time of the whole rollout."""

    def model_token_versions(self) -> list[int]:
        """The version of every model token whose version is known, in order."""
        if self.token_versions:
            return [v for v, m in zip(self.token_versions, self.response_mask) if m and v >= 0]
        return [span.weight_version for span in self.spans if span.kind == "model" and span.weight_version is not None
                for _ in range(span.start, span.end)]

    @property
    def turn_versions(self) -> list[int]:
        """The policy version of each model turn, in order (turns of an engine without versions left out). A
        trajectory in flight when new weights arrive continues on them, so later turns can be newer."""
        return [span.weight_version for span in self.spans if span.kind == "model" and span.weight_version is not None]

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy that wrote any of its tokens (what its staleness is counted from); None: unknown."""
        versions = self.turn_versions
        return min(versions) if versions else None


@dataclass
class FinishedGroup:
    """A finished GRPO group as the rollout hands it to a step's later stages."""

    index: int
    """The group's place in the step's prompts (prompt ``index``); the driver restores the step's order by it."""
    rank: int
    """The rollout rank that generated it."""
    trajectories: list[Trajectory]
    """The prompt's ``group_size`` samples, in sample order."""

    @property
    def infra_error(self) -> str | None:
        """The first infrastructure failure any of its samples met (after its re-runs); None: trainable."""
        return next((t.infra_error for t in self.trajectories if t.infra_error is not None), None)

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version behind any token of the group; None when no turn carries one."""
        versions = [v for t in self.trajectories if (v := t.oldest_version) is not None]
        return min(versions) if versions else None


@dataclass(frozen=True)
class RewardScore:
    """What the RewardGroup returns for one trajectory."""

    reward: float
    """The configured reward (``reward.score``), times ``reward.reward_scale``: what the trainer learns from."""
    em: float
    """Exact match of the last answer, whatever the reward: training and validation metrics report it."""

"""The training config as one pydantic model tree shaped like the YAML: each section a ``ConfigSection`` whose fields
are its keys, with their type, range (``Field``), choices (``Literal``), default and meaning (the docstring).

``validate_cfg`` parses the whole config with ``TrainConfigFile`` once (an unknown key, a value of the wrong type or out
of its range stops the run in one line naming the key); every reader then reads the parsed sections, and each worker
is handed a view built from them (``config/run.py``). The sections of the update (``actor``, ``critic``,
``inference``) are in ``config/model_update.py``. The eval config (``config/eval.py``) is the same sections with
only the keys an eval reads. The sections that are a worker's view as they are (``cluster``, ``monitors``) are that
view's own class; an open section (``tools``, a plugin's settings) is a mapping its reader validates.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlinf_search.config.model_update import (
    ActorSection,
    CriticSection,
    InferenceSection,
)
from rlinf_search.config.precision import Precision
from rlinf_search.distill.config import DistillSettings
from rlinf_search.monitors.config import MonitorsConfig
from rlinf_search.section_model import ConfigSection

# ---------------------------------------------------------------------------------------------------------- runner


class LoggerSection(ConfigSection):
    """``runner.logger``: where metrics go."""

    log_path: str = Field("", json_schema_extra={"default_words": "`<output_dir>/logs`"})
    """Where metrics.jsonl and TensorBoard files go (unset: ``<output_dir>/logs``)."""
    logger_backends: tuple[str, ...] = ("console", "jsonl")
    """Metric sinks (names and their packages checked by ``validate_cfg``)."""
    project_name: str = "rlinf-search"
    """W&B project."""
    experiment_name: str | None = Field(None, json_schema_extra={"default_words": "`runner.experiment_name`"})
    """The run's name in the metric sinks; wins over ``runner.experiment_name`` (RLinf writes it here)."""


class EvalRunnerSection(ConfigSection):
    """``runner`` as an eval reads it."""

    output_dir: str
    """Root of the run's outputs (checkpoints, logs, eval)."""
    experiment_name: str = "run"
    """The run's name in the metric sinks (the W&B run name): ``runner.logger.experiment_name``, else
    ``runner.experiment_name``."""
    seq_length: int = Field(4096, ge=2)
    """Prompt + response token budget per trajectory."""


class RunnerSection(EvalRunnerSection):
    """``runner``: how long to train, when to validate and save, where outputs go, how a step is pipelined."""

    task_type: Literal["searchr1"] = "searchr1"
    """The one task this trainer runs."""
    max_steps: int = Field(100, ge=1, json_schema_extra={
        "also": [(-1, "no step limit: runner.max_epochs ends the run")]})
    """Training steps (rollout + update) to run; the run stops at ``max_epochs`` first if that comes first.
    ``-1`` (as RLinf and verl write it): no step limit, ``max_epochs`` decides."""
    max_epochs: int = Field(1, ge=1)
    """Passes over the training data."""
    val_check_interval: int = Field(0, ge=0)
    """Validate every N steps (0: never during training)."""
    save_interval: int = Field(0, ge=0)
    """Checkpoint every N steps (0: only at the end)."""
    max_tokens_per_mbs: int | None = Field(None, ge=1)
    """Token budget of one micro-batch (forward/backward)."""
    resume_dir: str | None = None
    """A checkpoint folder to resume from, or ``auto`` for the newest one under ``output_dir``."""
    logger: LoggerSection = LoggerSection()
    """Metric sinks."""
    rollout_dump: int = Field(0, ge=0)
    """Trajectories of each step written to ``output_dir/rollouts/step_K.jsonl`` (and, when > 0, every
    validation trajectory to ``val_step_K.jsonl``); 0: none."""
    max_infra_failed_share: float = Field(0.25, ge=0, le=1)
    """A step whose share of GRPO groups dropped for an infrastructure failure (a search server down after the
    groups' re-runs, ``agentloop.infra_reruns``) is above this stops the run in one line naming the failure; at or
    below it, the step trains the rest. 0: any dropped group stops the run."""
    pipeline: Literal["sync", "overlap", "stream", "async"] | None = Field(None, json_schema_extra={
        "default_words": "null (`overlap` on a disaggregated placement, else `sync`)"})
    """How a step overlaps rollout and training (``config/pipeline.py``); unset: ``overlap`` on a disaggregated
    placement, else ``sync``."""
    max_staleness: int = Field(1, ge=1)
    """``async`` only: steps the rollout may run ahead of the update."""
    partial_rollout: bool = True
    """``async`` only: new weights reach the engines mid-trajectory, at a token boundary."""

# ------------------------------------------------------------------------------------------------------- algorithm


class SamplingSection(ConfigSection):
    """``algorithm.sampling_params``: how every turn samples."""

    do_sample: bool = True
    """Sample (true) or decode greedily (false)."""
    temperature: float = Field(1.0, ge=0, json_schema_extra={"relation": "> 0 when do_sample"})
    """Sampling temperature."""
    top_k: int = Field(0, ge=0, json_schema_extra={"also": [(-1, "off, as vLLM writes it")]})
    """Sample among the k most likely tokens (0: all)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens whose probability reaches p."""
    max_new_tokens: int = Field(500, ge=1)
    """Most tokens generated in one turn."""


class DistillSection(DistillSettings):
    """``algorithm.distill``: on-policy distillation (the term's keys are ``DistillSettings``'; validated with the
    teacher once ``enable`` is true)."""

    enable: bool = False
    """Distil from ``teacher``; false: every other key of the section is refused (it would do nothing)."""
    top_k_divergence: Literal["forward", "reverse"] = "forward"
    """The direction of the KL to the teacher's top k (``forward`` = KL(teacher || student), ``reverse``); read
    only with ``top_k`` > 0."""
    teacher: dict[str, Any] | None = None
    """The teacher's server and client limits (``TeacherConfig``)."""


class EvalAlgorithmSection(ConfigSection):
    """``algorithm`` as an eval reads it."""

    group_size: int = Field(4, ge=1)
    """Samples per prompt (RLinf's Search-R1 recipe uses 4; an eval: samples per question)."""
    sampling_params: SamplingSection = SamplingSection()
    """How every turn samples."""


class AlgorithmSection(EvalAlgorithmSection):
    """``algorithm``: the advantage, the loss and the update's shape."""

    null_kept = frozenset({"clip_ratio_c", "mismatch_correction"})  # null: no dual clip; no correction, even async

    adv_type: str = "grpo"
    """Advantage estimator: a registered name or a dotted path."""
    adv_settings: dict[str, Any] | None = None
    """The estimator's own keys, validated by the settings model it declares."""
    normalize_advantages: bool = True
    """Divide GRPO's group-centred rewards by the group's standard deviation."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount (REINFORCE++, GAE)."""
    lam: float = Field(1.0, ge=0, le=1)
    """GAE lambda."""
    recompute_logprobs: bool = True
    """Recompute old log-probs (actor or InferenceGroup) instead of using the engine's."""
    mask_observations: bool = True
    """Keep observation tokens (search results, corrective notes) out of the loss; false trains them as if the
    policy had written them (Search-R1's ``state_masking: false``)."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each rollout batch."""
    n_minibatches: int = Field(1, ge=1)
    """Optimizer steps per epoch; the batch is cut into this many mini-batches."""
    shuffle_rollout: bool = True
    """Shuffle the batch's rows before each epoch cuts it into mini-batches."""
    logprob_forward_micro_batch_size: int | None = Field(None, ge=1)
    """Rows per forward-only pass (old and reference log-probs); null packs rows by ``max_tokens_per_mbs``."""
    policy_loss: str = "ppo"
    """The loss per model token: a registered name or a dotted path."""
    policy_loss_settings: dict[str, Any] | None = None
    """The loss's own keys, validated by the settings model it declares."""
    ratio_clip_eps: float | None = Field(None, gt=0, lt=1, json_schema_extra={"default_words": "—"})
    """verl's symmetric clip: sets both ``clip_ratio_low`` and ``clip_ratio_high`` where they are unset."""
    clip_ratio_low: float | None = Field(None, gt=0, lt=1, json_schema_extra={
        "default_words": "`ratio_clip_eps`, else 0.2"})
    """PPO clip below 1."""
    clip_ratio_high: float | None = Field(None, gt=0, json_schema_extra={
        "default_words": "`ratio_clip_eps`, else `clip_ratio_low`"})
    """PPO clip above 1 (DAPO/slime use 0.28)."""
    clip_ratio_c: float | None = Field(3.0, gt=1)
    """Dual-clip constant for negative advantages; null turns it off."""
    value_clip: float = Field(0.5, gt=0)
    """The critic's value clip (GAE)."""
    loss_agg_func: str = "token-mean"
    """``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm``."""
    kl_beta: float = Field(0.0, ge=0)
    """Coefficient of the KL-to-reference loss term (Search-R1: 0.001); 0 skips the reference model."""
    kl_penalty_type: str = "low_var_kl"
    """KL estimator: ``k1``, ``k2``, ``low_var_kl`` (k3)."""
    entropy_bonus: float = Field(0.0, ge=0)
    """Entropy coefficient (Search-R1: 0.001, RLinf: 0)."""
    mismatch_correction: str | None = None
    """Train/inference mismatch and staleness correction: null, ``tis``, ``mask``, ``decoupled`` or ``m2po``
    (unset on an async pipeline: ``tis``)."""
    max_token_lag: int | None = Field(None, ge=0)
    """Model tokens sampled more than this many policy versions back are dropped from the loss; null keeps all."""
    distill: DistillSection = DistillSection()
    """On-policy distillation."""

# ---------------------------------------------------------------------------------- data, rollout, agent, reward


class EvalDataSection(ConfigSection):
    """``data`` as an eval reads it."""

    seed: int = Field(0, ge=0)
    """Data order and engine sampling seed (each rollout rank samples with seed + rank)."""
    val_data_paths: tuple[str, ...] = ()
    """Prepared validation jsonl files."""
    max_prompt_length: int = Field(1024, ge=1, json_schema_extra={"relation": "< runner.seq_length"})
    """Most prompt tokens (after the chat template)."""
    filter_overlong_prompts: bool = False
    """Drop overlong prompts at start-up (the count is logged)."""
    truncation: Literal["error", "left", "right"] = "error"
    """What the agent loop does with an overlong prompt that was not dropped: refuse it, keep its end, its start."""
    apply_chat_template: bool = True
    """Chat prompts go through the tokenizer's chat template."""


class DataSection(EvalDataSection):
    """``data``: the prompts and how a step takes them."""

    train_data_paths: tuple[str, ...] = Field((), json_schema_extra={"default_words": "required"})
    """Prepared training jsonl files (``python -m rlinf_search.data.prepare``)."""
    rollout_batch_size: int = Field(1, ge=1)
    """Prompts per step."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""


class RolloutModelSection(ConfigSection):
    """``rollout.model``."""

    model_path: str
    """A Hugging Face model directory (the starting policy, and the reference)."""
    precision: Precision | None = Field(None, json_schema_extra={"default_words": "`auto`"})
    """The engine's dtype; unset: bf16 on GPU, fp32 on CPU."""


class RolloutSection(ConfigSection):
    """``rollout``: which engine, from which weights, with how much memory."""

    group_name: str = "RolloutGroup"
    """The rollout workers' group, which also runs the agent loop."""
    rollout_backend: str = "hf"
    """``hf`` (the CPU default), ``vllm``, or a dotted path to a factory."""
    model: RolloutModelSection
    """The starting policy."""
    max_running_requests: int = Field(64, ge=1)
    """Most sequences an engine decodes at once (vLLM's ``max_num_seqs``)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Read by vLLM only: share of the device's memory it takes for weights and KV cache."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one engine spans (1 in this build: one engine per device)."""
    update_weights_bucket_megabytes: int = Field(256, ge=1)
    """The size of each bucket a weight sync streams to the engines."""
    seeded: bool = True
    """Every request samples with its own seed, so a resumed run replays the rollout exactly."""
    engine_settings: dict[str, Any] | None = None
    """The engine's own keys, validated by the settings model its factory declares."""


class AgentSection(ConfigSection):
    """``agent``: how the model acts."""

    protocol: str = "searchr1"
    """``searchr1`` (tags), ``toolcall`` (function calling through the chat template) or a dotted path."""
    protocol_settings: dict[str, Any] | None = None
    """The protocol's own keys, validated by the settings model its loop class declares."""


class AgentLoopSection(ConfigSection):
    """``agentloop``: the limits of every trajectory."""

    num_workers: int = Field(0, ge=0)
    """Ranks of an AgentLoop group that sends turns to the rollout engines through a router; 0: each rollout rank
    runs the loops of its share itself."""
    max_turns: int = Field(2, ge=0)
    """Tool turns (searches and corrective observations) before the final generation without search."""
    max_tool_response_length: int = Field(500, ge=1)
    """Most tokens in one observation; longer ones are cut, keeping the closing tag."""
    max_passage_tokens: int = Field(150, ge=1)
    """Each retrieved passage is cut to this many tokens before formatting."""
    infra_reruns: int = Field(2, ge=0)
    """Times a GRPO group is rolled out again after a tool call failed for an infrastructure reason."""
    infra_rerun_wait_s: float = Field(5.0, ge=0)
    """Wait before a group's first re-run; each later one waits twice as long."""
    retokenize: bool = False
    """Decode each turn, cut at the stop tag and re-encode it, as the reference implementations do."""


class RewardSection(ConfigSection):
    """``reward``: what the RewardGroup grades with."""

    group_name: str = "RewardGroup"
    """The reward workers' group."""
    reward_type: Literal["searchr1"] = "searchr1"
    """The one reward family (``score`` picks the variant)."""
    score: str = "em"
    """A registered reward (``em``, ``subem``, ``f1``, ``format_em``) or a dotted path."""
    reward_scale: float = Field(1.0, gt=0)
    """Multiplier of the score."""
    score_settings: dict[str, Any] | None = None
    """The score's own keys, validated by the settings model it declares."""


# ----------------------------------------------------------------------------------------------------- the config


class EvalConfigFile(ConfigSection):
    """An eval config: a training config's sections with only the keys an eval reads."""

    hydra: dict[str, Any] | None = None
    """Hydra's own settings."""
    cluster: dict[str, Any] | None = None
    """Nodes, devices and the placement (``ClusterConfig``, checked with the placement)."""
    runner: EvalRunnerSection
    """The run's name and outputs."""
    algorithm: EvalAlgorithmSection = EvalAlgorithmSection()
    """Samples per question and sampling."""
    agent: AgentSection = AgentSection()
    """How the model acts."""
    agentloop: AgentLoopSection = AgentLoopSection()
    """Trajectory limits."""
    tools: dict[str, Any] | None = None
    """``tools.search`` (``SearchToolConfig``) and the tools beside it (``config/tools.py``)."""
    rollout: RolloutSection
    """The engine."""
    data: EvalDataSection = EvalDataSection()
    """The questions."""
    reward: RewardSection = RewardSection()
    """The reward reported beside EM, sub-EM and F1."""


class TrainConfigFile(EvalConfigFile):
    """A training config."""

    runner: RunnerSection
    """Steps, intervals, outputs, logging, the pipeline."""
    algorithm: AlgorithmSection = AlgorithmSection()
    """The advantage, the loss and the update."""
    data: DataSection = DataSection()
    """The prompts."""
    actor: ActorSection = ActorSection()
    """The policy's training."""
    critic: CriticSection = CriticSection()
    """The value model."""
    inference: InferenceSection = InferenceSection()
    """A separate log-prob group."""
    monitors: MonitorsConfig = MonitorsConfig()
    """The collapse monitors."""

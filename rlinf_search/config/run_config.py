"""``RunConfig``: everything a training run needs, validated once by ``validate_cfg`` (``config/run.py``).

Workers get their own sections of it (``ActorConfig``, ``RewardConfig``, ...), never the raw config. The run-level
keys (batch, group size, advantage estimator, group names) are declared in ``config/model.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.config.runner import RunnerConfig
from rlinf_search.data.prompt_tokens import PromptLimit
from rlinf_search.distill.config import DistillConfig
from rlinf_search.monitors.config import MonitorsConfig
from rlinf_search.scheduler.config import ClusterConfig
from rlinf_search.scheduler.placement import Placement
from rlinf_search.tools.search.config import SearchToolConfig
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.critic.config import CriticConfig
from rlinf_search.workers.inference.config import InferenceConfig
from rlinf_search.workers.inference.plan import LogprobPlan
from rlinf_search.workers.reward.config import RewardConfig
from rlinf_search.workers.rollout.config import RolloutConfig


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs, validated: the sections' views, the run-level keys, and what is computed from several
    keys."""

    cluster: ClusterConfig
    """``cluster``: nodes, CPU slots, Ray address."""
    placement: Placement
    """``cluster.component_placement`` resolved to devices and ranks (actor, rollout and reward are placed)."""
    runner: RunnerConfig
    """``runner``: steps, intervals, outputs, logging."""
    total_steps: int
    """Training steps the run lasts: ``runner.max_steps``, or fewer when ``runner.max_epochs`` passes over
    the training prompts end it first (an epoch is ``prompts // rollout_batch_size`` steps)."""
    actor: ActorConfig
    """The policy update (``actor`` plus the ``algorithm`` loss keys)."""
    agent_loop: AgentLoopConfig
    """``agentloop`` plus sampling and token budgets."""
    search: SearchToolConfig
    """``tools.search``."""
    rollout: RolloutConfig
    """``rollout``: the engine (hf, vllm), the starting policy's path (also the reference), its memory."""
    train_data_paths: tuple[str, ...]
    """Prepared training jsonl files."""
    val_data_paths: tuple[str, ...]
    """Prepared validation jsonl files (may be empty)."""
    rollout_batch_size: int = 1
    """Prompts per step."""
    group_size: int = 4
    """Samples per prompt (RLinf's Search-R1 recipe uses 4)."""
    adv_type: str = "grpo"
    """Advantage estimator: a registered name or a dotted path."""
    adv_settings: Any = None
    """``algorithm.adv_settings`` validated by the settings model the estimator declares (``@with_settings``);
    None for one that declares none."""
    recompute_logprobs: bool = True
    """Recompute old log-probs (actor or InferenceGroup) instead of using the engine's."""
    mask_observations: bool = True
    """Keep observation tokens (search results, corrective notes) out of the loss. ``false`` trains them as if the
    policy had written them (Search-R1's ``state_masking: false``, the paper's ablation)."""
    inference: InferenceConfig
    """``inference``: whether an InferenceGroup computes the log-probs apart from the actor, and how."""
    logprobs: LogprobPlan
    """Who computes the old and reference log-probs and which groups receive weights (from the three keys
    above and ``algorithm.kl_beta``); everything that launches, calls or syncs reads this."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""
    seed: int = 0
    """Data order and engine sampling seed."""
    agent_loop_workers: int = 0
    """``agentloop.num_workers``: ranks of the AgentLoop group, whose agent loops send each turn to one of the
    rollout group's engines (token-in/token-out servers) through a router. 0: each rollout rank runs the
    agent loops of its share itself, on its own engine."""
    prompt_limit: PromptLimit
    """``data.max_prompt_length`` and what overlong prompts get (dropped at start-up, refused or cut)."""
    reward: RewardConfig
    """``reward``: the RewardGroup's own section."""
    actor_group: str = "ActorGroup"
    """``actor.group_name``: the name the actor's worker group is launched under (logs, errors)."""
    rollout_group: str = "RolloutGroup"
    """``rollout.group_name``: the rollout workers' group, which also runs the agent loop."""
    reward_group: str = "RewardGroup"
    """``reward.group_name``: the reward workers' group."""
    normalize_advantages: bool = True
    """``algorithm.normalize_advantages``."""
    gamma: float = 1.0
    """Discount (REINFORCE++, GAE)."""
    lam: float = 1.0
    """GAE lambda."""
    critic: CriticConfig | None = None
    """The value model for GAE (``critic`` with ``use_critic_model: true``); None without one."""
    monitors: MonitorsConfig = field(default_factory=MonitorsConfig)
    """``monitors``: the collapse monitors' thresholds and which of them stop the run."""
    distill: DistillConfig | None = None
    """``algorithm.distill``: the teacher and its advantage term; None when the run does not distil."""
    settings: dict = field(default_factory=dict)
    """The config as validated (interpolations resolved, RLinf keys mapped): the run's record, saved as
    ``output_dir/config.yaml`` and handed to W&B and TensorBoard. Workers never read it."""

"""Start a training run: the cluster, the worker groups on their placements, then the runner.

Entry scripts call ``train(validate_cfg(cfg))``; each line below is one named step.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from rlinf_search.config import ConfigError, RunConfig
from rlinf_search.data.prompt_tokens import PromptTooLong
from rlinf_search.data.readers import PrepareError
from rlinf_search.runners.group_calls import Groups
from rlinf_search.runners.infra_failures import RunStopped
from rlinf_search.runners.preflight import check_files, check_services
from rlinf_search.runners.prompt_sets import RunPrompts, load_run_prompts
from rlinf_search.runners.resume import find_resume_point
from rlinf_search.runners.train_runner import SearchR1Runner
from rlinf_search.scheduler import Cluster, WorkerError, WorkerGroup
from rlinf_search.scheduler.placement import host_placement
from rlinf_search.workers.actor.backends import require_training_backend
from rlinf_search.workers.actor.worker import ActorWorker
from rlinf_search.workers.critic.worker import CriticWorker
from rlinf_search.workers.inference.worker import InferenceWorker
from rlinf_search.workers.reward.worker import RewardWorker
from rlinf_search.workers.rollout.agent_loop_worker import AGENT_LOOP_GROUP, AgentLoopWorker
from rlinf_search.workers.rollout.server import EngineServerWorker
from rlinf_search.workers.rollout.worker import RolloutWorker
from rlinf_search.workers.tool.launch import launch_search_group


def launch_groups(config: RunConfig, cluster: Cluster, resume: Path | None) -> Groups:
    """Every worker group on its placement (the critic, the InferenceGroup and the SearchTool group when the
    config has them)."""
    placement = cluster.placement
    require_training_backend(config.actor, device_kind=cluster.device_kind,
                             actor_ranks=len(placement["actor"].ranks))
    actor = ActorWorker.create_group(config.actor, str(resume) if resume else None).launch(
        cluster, placement["actor"], name=config.actor_group)
    rollout, engines = launch_rollout_groups(config, cluster)
    search = launch_search_group(config.search, cluster, rollout, restarts=config.cluster.max_restarts)
    reward = RewardWorker.create_group(config.reward).launch(cluster, placement["reward"], name=config.reward_group)
    critic = None
    if config.critic is not None:  # on the actor's devices: it trains on the same rows at the same time
        critic = CriticWorker.create_group(config.critic, config.actor.offload, str(resume) if resume else None).launch(
            cluster, placement["actor"], name=config.critic.group_name)
    inference = None
    plan = config.logprobs
    if plan.launches_inference:  # else the actor computes the log-probs on its own devices
        inference = InferenceWorker.create_group(config.actor, config.inference, policy=plan.old == "inference",
                                                 reference=plan.reference == "inference").launch(
            cluster, placement["inference"], name=config.inference.group_name)
    return Groups(rollout=rollout, actor=actor, reward=reward, critic=critic, inference=inference, search=search,
                  engines=engines)


def launch_rollout_groups(config: RunConfig, cluster: Cluster) -> tuple[WorkerGroup, WorkerGroup | None]:
    """The group that runs the agent loops, and the engine servers when that is not the same group.

    ``agentloop.num_workers`` 0: rollout ranks on the rollout devices, each with its engine and its share of
    the agent loops (no engine servers). >= 1: engine servers on the rollout devices, and that many
    AgentLoop ranks beside the driver (they use no device) whose routers spread turns over every engine."""
    # Rollout ahead of the update: a rank runs the rollouts of up to max_staleness + 1 steps at once, each call on a
    # thread of its own, beside the weight sync and the driver's other calls (validation, engine activity).
    threads = config.runner.pipeline.max_staleness + 4 if config.runner.pipeline.ahead else None
    if config.agent_loop_workers == 0:
        rollout = RolloutWorker.create_group(config.rollout, config.agent_loop, config.search, config.seed).launch(
            cluster, cluster.placement["rollout"], name=config.rollout_group, max_concurrency=threads)
        return rollout, None
    engines = EngineServerWorker.create_group(config.rollout, config.seed).launch(
        cluster, cluster.placement["rollout"], name=config.rollout_group)
    loops = AgentLoopWorker.create_group(config.rollout, config.agent_loop, config.search, config.seed).launch(
        cluster, host_placement(AGENT_LOOP_GROUP, config.agent_loop_workers), name=AGENT_LOOP_GROUP,
        max_concurrency=threads)
    loops.call(AgentLoopWorker.use_engines, list(engines.actors)).wait()
    return loops, engines


def read_prompts(config: RunConfig) -> RunPrompts:
    """The run's prompts held to ``data.max_prompt_length``; an overlong one is a ``ConfigError`` (its uid
    named) before any worker starts, unless the config drops or truncates such prompts."""
    try:
        return load_run_prompts(train_paths=config.train_data_paths, val_paths=config.val_data_paths,
                                model_path=config.rollout.model_path, limit=config.prompt_limit)
    except (PromptTooLong, PrepareError) as exc:
        raise ConfigError(str(exc)) from None


def save_settings(config: RunConfig) -> Path:
    """``output_dir/config.yaml``: the validated config, interpolations resolved, RLinf keys mapped. A run
    started from it (``--config-path OUTPUT --config-name config``) has the same settings."""
    out = Path(config.runner.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    OmegaConf.save(OmegaConf.create(config.settings), path)
    return path


def train(config: RunConfig) -> None:
    check_files(config)  # output folder, model, template, checkpoint: one line each, before any worker
    resume = find_resume_point(config.runner)
    prompts = read_prompts(config)  # a config error in the data is reported before a service that is down
    check_services(config)  # every retrieval server and the teacher answer
    save_settings(config)
    with Cluster(config.cluster) as cluster:
        groups = launch_groups(config, cluster, resume)
        runner = SearchR1Runner(config, groups, resumed_from=resume, prompts=prompts)
        if resume:
            # The engine (and the InferenceGroup's policy copy) start from the checkpoint's weights.
            runner.weight_sync.sync(version=runner.state.global_step)
        try:
            runner.fit()
        except WorkerError as exc:
            if not exc.process_lost:
                raise  # a bug in a method: its traceback is what a person needs
            try:
                lost = runner.stages.source.lost_in_flight()
            except Exception:  # noqa: BLE001 - counting must not hide the loss being reported
                lost = 0
            in_flight = f" and {lost} GRPO groups in flight were lost" if lost else ""
            raise RunStopped(f"{exc.group} rank {exc.rank} was lost during {exc.method}() ({exc.cause_type}) in step "
                             f"{runner.state.global_step + 1}; that step was not kept{in_flight}. Resume from the last "
                             "checkpoint with runner.resume_dir=auto") from None
        runner.weight_sync.close()

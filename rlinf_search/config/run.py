"""The training run's config: ``validate_cfg`` checks the whole YAML once and returns ``RunConfig``.

``validate_cfg(cfg)`` rejects unknown keys and every broken cross-field rule with the key's path,
before any worker starts; renamed keys are accepted with a one-line deprecation message. Workers get
their own sections of ``RunConfig`` (``ActorConfig``, ``RewardConfig``, ...), never the raw config.
"""

from __future__ import annotations

from dataclasses import replace

from omegaconf import DictConfig

from rlinf_search.algorithms import ADVANTAGE_ESTIMATORS, estimators_with, traits_of
from rlinf_search.config.distill import distill_config
from rlinf_search.config.file_checks import FileChecks
from rlinf_search.config.model import EvalConfigFile, RunnerSection, TrainConfigFile
from rlinf_search.config.pipeline import async_correction, resolve_pipeline
from rlinf_search.config.raw import resolve_raw
from rlinf_search.config.readers import entry_settings, parse_config
from rlinf_search.config.run_config import RunConfig
from rlinf_search.config.runner import RunnerConfig
from rlinf_search.config.schema import SCHEMA, ConfigError
from rlinf_search.config.sections import (
    agent_loop,
    cluster_placement,
    data_paths,
    prompt_limit,
    require_placed,
    reward_config,
    rollout_config,
    sampling_params,
    with_offered_tools,
)
from rlinf_search.config.training import actor_config, critic_config, policy_loss
from rlinf_search.data.prepare import count_records
from rlinf_search.monitors import check_stop_on
from rlinf_search.runners.metric_logger import check_backends
from rlinf_search.scheduler.placement import Placement
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.inference.config import InferenceConfig
from rlinf_search.workers.inference.plan import LogprobPlan

# Components a training run must place.
TRAINING_COMPONENTS = ("actor", "rollout", "reward")


def _runner(section: RunnerSection) -> RunnerConfig:
    try:
        check_backends(section.logger.logger_backends)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RunnerConfig(
        output_dir=section.output_dir, experiment_name=section.logger.experiment_name or section.experiment_name,
        max_steps=None if section.max_steps == -1 else section.max_steps, max_epochs=section.max_epochs,
        val_check_interval=section.val_check_interval, save_interval=section.save_interval,
        seq_length=section.seq_length, max_tokens_per_mbs=section.max_tokens_per_mbs, resume_dir=section.resume_dir,
        log_path=section.logger.log_path, logger_backends=section.logger.logger_backends,
        project_name=section.logger.project_name, rollout_dump=section.rollout_dump,
        max_infra_failed_share=section.max_infra_failed_share)


def _total_steps(runner: RunnerConfig, train_paths: tuple[str, ...], batch: int, files: FileChecks) -> int:
    """``runner.max_steps``, or fewer when ``max_epochs`` passes over the prompts come first. An epoch is
    ``prompts // batch`` steps, as the runner's ``PromptStream`` drops an incomplete last batch. Without the files
    (``files.enabled`` false): ``max_steps``, or 1 where only the files could say."""
    if not files.enabled:
        return runner.max_steps or 1
    prompts = sum(count_records(path) for path in train_paths)
    if prompts < batch:
        raise ConfigError(f"data.rollout_batch_size ({batch}) is larger than the training set ({prompts} prompts "
                          "in data.train_data_paths)")
    epoch_steps = runner.max_epochs * (prompts // batch)
    return epoch_steps if runner.max_steps is None else min(runner.max_steps, epoch_steps)


def group_names(cfg: EvalConfigFile) -> dict[str, str]:
    """Each component's worker-group name (``<component>.group_name``) of the components ``cfg`` launches (all
    five for training, rollout and reward for an eval); two groups may not share one."""
    names = {"rollout": cfg.rollout.group_name, "reward": cfg.reward.group_name}
    if isinstance(cfg, TrainConfigFile):
        names = {"actor": cfg.actor.group_name, **names, "inference": cfg.inference.group_name,
                 "critic": cfg.critic.group_name}
    owner: dict[str, str] = {}
    for component, name in names.items():
        if name in owner:
            raise ConfigError(f"{component}.group_name: {name!r} is {owner[name]}.group_name too; each worker "
                              "group needs its own name")
        owner[name] = component
    return names


def _batching(cfg: TrainConfigFile) -> None:
    """``algorithm.group_size``, ``data.rollout_batch_size``, ``algorithm.adv_type`` and the critic, checked
    together."""
    algorithm, batch = cfg.algorithm, cfg.data.rollout_batch_size
    group_size, adv_type = algorithm.group_size, algorithm.adv_type
    try:
        traits = traits_of(ADVANTAGE_ESTIMATORS.resolve(adv_type, key="algorithm.adv_type"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if traits.needs_group and group_size < 2:
        raise ConfigError(f"algorithm.group_size must be >= 2 for {adv_type}: a group of one has advantage 0")
    use_critic = cfg.critic.use_critic_model
    if traits.needs_critic and not use_critic:
        raise ConfigError(f"algorithm.adv_type: {adv_type} needs critic.use_critic_model: true (it bootstraps from "
                          "the critic's values)")
    if use_critic and not traits.needs_critic:
        raise ConfigError(f"critic.use_critic_model: true needs algorithm.adv_type: "
                          f"{', '.join(estimators_with(needs_critic=True))} (an estimator that reads the critic's "
                          f"values); {adv_type} never reads them")
    if (batch * group_size) % algorithm.n_minibatches:
        raise ConfigError(f"data.rollout_batch_size * algorithm.group_size ({batch * group_size}) must divide "
                          f"into algorithm.n_minibatches ({algorithm.n_minibatches})")


def _inference(cfg: TrainConfigFile, placement: Placement, *, actor: ActorConfig) -> InferenceConfig:
    try:
        return InferenceConfig.from_placement(
            placement, recompute=cfg.algorithm.recompute_logprobs, kl_beta=actor.loss.kl_beta,
            group_name=cfg.inference.group_name, load_from_actor=cfg.inference.load_from_actor,
            forward_micro_batch_size=actor.forward_micro_batch_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def sync_dtype(receivers: list[str]) -> str | None:
    """The dtype weights are sent in: the one 16-bit dtype all ``receivers`` load, else None (fp32). Casting to
    anything else first would round twice (fp32 -> bf16 -> fp16 is not fp32 -> fp16)."""
    kinds = set(receivers)
    return kinds.pop() if len(kinds) == 1 and kinds <= {"float16", "bfloat16"} else None


def _check_trained_observations(cfg: TrainConfigFile, pipeline: str, *, correction: str | None) -> None:
    """``algorithm.mask_observations: false`` trains tokens the engine never sampled: they have no behaviour
    log-prob, so the old log-probs must be recomputed and nothing may weigh by the engine's."""
    algorithm = cfg.algorithm
    if algorithm.mask_observations:
        return
    why = ("algorithm.recompute_logprobs is false" if not algorithm.recompute_logprobs else
           f"runner.pipeline is {pipeline}" if pipeline != "sync" else
           f"algorithm.mismatch_correction is {correction}" if correction else
           "algorithm.distill is set" if "distill" in algorithm.model_fields_set else None)
    if why:
        raise ConfigError(f"algorithm.mask_observations: false needs engine-free old log-probs, but {why}: observation "
                          "tokens have no behaviour log-prob; use runner.pipeline: sync with "
                          "algorithm.recompute_logprobs: true and no mismatch_correction or distill")


def validate_cfg(cfg: DictConfig | dict, *, files: FileChecks | None = None) -> RunConfig:
    """Check the whole config once; return its typed view. Raises ``ConfigError`` naming the key. ``files``: open
    the files the config names (the default) or list them as skipped (``rlinf-search check --no-files``)."""
    files = files or FileChecks()
    raw = resolve_raw(cfg, schema=SCHEMA)
    parsed = parse_config(TrainConfigFile, raw)
    algorithm, data = parsed.algorithm, parsed.data
    runner = _runner(parsed.runner)
    limit = prompt_limit(data, seq_length=runner.seq_length)
    _batching(parsed)
    adv_type = algorithm.adv_type
    adv_settings = entry_settings(algorithm.adv_settings, ADVANTAGE_ESTIMATORS.resolve(adv_type),
                                  "algorithm.adv_settings", name=f"adv_type {adv_type}")
    recompute, retokenize = algorithm.recompute_logprobs, parsed.agentloop.retokenize
    if retokenize and not recompute:
        raise ConfigError("agentloop.retokenize: true needs algorithm.recompute_logprobs: true: re-tokenized ids "
                          "were never scored by the engine, so their old log-probs must be recomputed")
    groups = group_names(parsed)
    sampling = sampling_params(algorithm.sampling_params)
    rollout = rollout_config(parsed.rollout, sampling, recompute=recompute)
    search, loop = agent_loop(parsed, sampling, limit=limit, seq_length=runner.seq_length, files=files)
    limit = with_offered_tools(limit, loop)
    # Names a registry resolves (the loss's, the reward's) are checked before the files and the cluster.
    loss = policy_loss(algorithm, max_response_tokens=runner.seq_length - limit.max_prompt_tokens,
                       temperature=sampling.temperature)
    reward = reward_config(parsed.reward)
    cluster, placement = cluster_placement(parsed.cluster, rollout.backend)
    require_placed(placement, TRAINING_COMPONENTS, run="a training run")
    train_paths = data_paths(data.train_data_paths, "data.train_data_paths", required=True, files=files)
    val_paths = data_paths(data.val_data_paths, "data.val_data_paths", required=False, files=files)
    total_steps = _total_steps(runner, train_paths, data.rollout_batch_size, files)
    actor = actor_config(parsed, model_path=rollout.model_path, loss=loss, run_steps=total_steps)
    inference = _inference(parsed, placement, actor=actor)
    logprobs = LogprobPlan.decide(recompute=recompute, kl=actor.loss.kl_beta > 0, separate=inference.separate)
    # The InferenceGroup's policy copy (recomputed old log-probs on devices of its own) loads the compute dtype.
    receivers = [rollout.dtype] + ([actor.dtype] if "inference" in logprobs.weight_receivers else [])
    actor = replace(actor, sync_dtype=sync_dtype(receivers))
    critic = critic_config(parsed, actor, total_steps=total_steps)
    written = parsed.runner.model_fields_set
    runner = replace(runner, pipeline=resolve_pipeline(
        parsed.runner.pipeline,
        max_staleness=parsed.runner.max_staleness, partial_rollout=parsed.runner.partial_rollout,
        written={key for key in ("max_staleness", "partial_rollout") if key in written},
        placement=placement, plan=logprobs, adv_type=adv_type,
        ppo_epochs=actor.ppo_epochs, n_minibatches=actor.n_minibatches, batch=data.rollout_batch_size,
        critic=critic is not None))
    if runner.pipeline.ahead and retokenize:
        raise ConfigError(f"agentloop.retokenize: true with runner.pipeline {runner.pipeline.name}: re-tokenized ids "
                          "have no behaviour log-prob, so the staleness correction cannot weigh them; set "
                          "agentloop.retokenize: false or runner.pipeline: sync")
    correction = async_correction(runner.pipeline, written=actor.loss.mismatch_correction, recompute=recompute,
                                  present="mismatch_correction" in algorithm.model_fields_set)
    actor = replace(actor, loss=replace(actor.loss, mismatch_correction=correction))
    _check_trained_observations(parsed, runner.pipeline.name, correction=correction)
    monitors = parsed.monitors
    try:
        check_stop_on(monitors.stop_on)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RunConfig(
        cluster=cluster, placement=placement, runner=runner, total_steps=total_steps, actor=actor,
        rollout_batch_size=data.rollout_batch_size, group_size=algorithm.group_size, adv_type=adv_type,
        adv_settings=adv_settings, recompute_logprobs=recompute, mask_observations=algorithm.mask_observations,
        shuffle=data.shuffle, seed=data.seed, agent_loop_workers=parsed.agentloop.num_workers,
        normalize_advantages=algorithm.normalize_advantages, gamma=algorithm.gamma, lam=algorithm.lam,
        agent_loop=loop, search=search, rollout=rollout, train_data_paths=train_paths, val_data_paths=val_paths,
        inference=inference, logprobs=logprobs, prompt_limit=limit, reward=reward, critic=critic,
        actor_group=groups["actor"], rollout_group=groups["rollout"], reward_group=groups["reward"],
        distill=distill_config(algorithm.distill, temperature=sampling.temperature), monitors=monitors, settings=raw)

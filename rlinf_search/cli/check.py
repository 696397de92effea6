"""``rlinf-search check CONFIG [key=value ...]``: every check of a run that needs no worker, no GPU and no data.

Keys (every misspelt one, with the nearest name), values, the cross-key rules, the placement against the cluster
shape the config declares, and, unless ``--no-files``, the files it names: the data, the model folder, a tool
config. The same validation a run makes before its first worker starts (``validate_cfg`` or
``validate_eval_cfg``), so a config that passes here fails on the cluster only for what it could not see here, and
``--no-files`` lists that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from rlinf_search.cli.configs import compose
from rlinf_search.config.eval import EVAL_SCHEMA, validate_eval_cfg
from rlinf_search.config.file_checks import FileChecks
from rlinf_search.config.raw import resolve_raw
from rlinf_search.config.run import validate_cfg
from rlinf_search.config.model import EvalConfigFile, TrainConfigFile
from rlinf_search.config.readers import config_problems
from rlinf_search.config.schema import SCHEMA, ConfigError

KINDS = ("auto", "train", "eval")


@dataclass
class CheckReport:
    """What ``check`` found."""

    kind: str
    """``train`` or ``eval``: the validation the config went through."""
    problems: list[str] = field(default_factory=list)
    """One line each; empty: the config passes."""
    skipped: list[str] = field(default_factory=list)
    """The file checks not made (``--no-files``), one line each."""
    summary: str = ""
    """What the config runs, in one line (when it passes)."""


def run_kind(cfg, kind: str, config: str) -> str:
    """``train`` or ``eval``; ``auto``: an eval recipe (named ``*-eval``, or with no training data and no actor)."""
    if kind != "auto":
        return kind
    data = cfg.get("data") or {}
    if Path(config).stem.endswith("-eval") or ("actor" not in cfg and not data.get("train_data_paths")):
        return "eval"
    return "train"


def check(config: str, overrides: list[str], *, files: bool = True, kind: str = "auto") -> CheckReport:
    """Compose ``config`` with ``overrides`` and validate it as its run would, collecting every problem it can."""
    try:
        cfg = compose(config, overrides)
    except ConfigError as exc:
        return CheckReport(kind=kind, problems=[str(exc)])
    kind = run_kind(cfg, kind, config)
    report = CheckReport(kind=kind)
    schema = SCHEMA if kind == "train" else EVAL_SCHEMA
    try:
        raw = resolve_raw(cfg, schema=schema)
    except ConfigError as exc:
        report.problems.append(str(exc))
        return report
    # Every refused key at once: one misspelling should not hide the next. The rules after read the keys, so
    # they run only on a config whose keys all parse.
    report.problems += config_problems(TrainConfigFile if kind == "train" else EvalConfigFile, raw)
    if report.problems:
        return report
    checks = FileChecks(enabled=files)
    try:
        if kind == "train":
            run = validate_cfg(OmegaConf.create(raw), files=checks)
            report.summary = _train_summary(run)
            model = run.rollout.model_path
        else:
            run = validate_eval_cfg(OmegaConf.create(raw), files=checks)
            report.summary = (f"eval of {run.rollout.model_path} on {len(run.val_data_paths)} file(s), "
                              f"{run.samples_per_prompt} sample(s) a question, {placement_text(run.placement)}")
            model = run.rollout.model_path
    except ConfigError as exc:
        report.problems.append(str(exc))
        return report
    if not files:
        checks.skip("rollout.model.model_path", f"{model} not opened (that it is a Hugging Face model folder)")
    elif not (Path(model) / "config.json").is_file():
        report.problems.append(f"rollout.model.model_path: {model} is not a Hugging Face model folder (no "
                               "config.json); give the folder, or --no-files to check the rest without it")
    report.skipped = checks.skipped
    return report


def _train_summary(run) -> str:
    return (f"training, {placement_text(run.placement)}, pipeline {run.runner.pipeline.name}, {run.total_steps} steps of "
            f"{run.rollout_batch_size} prompts x {run.group_size}, actor {run.actor.training_backend}, "
            f"rollout {run.rollout.backend}")


def placement_text(placement) -> str:
    """``collocated on 1 node x 8 cuda: actor 8, rollout 8, reward 8``."""
    topology = placement.topology
    nodes = topology.devices_per_node
    shape = f"{len(nodes)} node{'s' if len(nodes) > 1 else ''} x {nodes[0]} {topology.device_kind}"
    ranks = ", ".join(f"{name} {component.world_size}" for name, component in placement.components.items())
    return f"{placement.mode} on {shape}: {ranks}"

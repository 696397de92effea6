"""What an eval of a checkpoint rolls out with: the retrieval and protocol settings its training run used.

A model trained with one passage per search and scored with three sees contexts it never saw (the demo's
model scored EM 0.000 that way and 0.760 with its own ``topk``). So an eval reads the training run's saved
config (``runner.output_dir/config.yaml``, which ``runners/train_main.py`` writes; a checkpoint's
``hf_model`` sits at ``output_dir/checkpoints/global_step_N/hf_model``) and builds the agent loop and
search tool from it with the same readers training used. A flag given on the command line wins, and a
flag that differs from the training value says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.config.raw import resolve_raw
from rlinf_search.config.model import TrainConfigFile
from rlinf_search.config.readers import parse_config
from rlinf_search.config.schema import SCHEMA, ConfigError
from rlinf_search.config.sections import agent_loop, prompt_limit, sampling_params
from rlinf_search.data.io_struct import SamplingParams
from rlinf_search.tools.search.config import SearchToolConfig

TRAINING_CONFIG = "config.yaml"
"""The file ``runners/train_main.py`` writes into ``runner.output_dir``."""
_SEARCH_UP = 4
"""Folders looked in, from the model's own upwards: hf_model, global_step_N, checkpoints, the run."""


class CheckpointNotFound(ValueError):
    """``--model`` names no model folder."""


@dataclass(frozen=True)
class EvalOverrides:
    """The eval's own flags; None: the training run's value (or the default without a training config)."""

    topk: int | None = None
    """``--topk``: passages per search (``tools.search.topk``)."""
    protocol: str | None = None
    """``--protocol``: ``agent.protocol``."""
    max_turns: int | None = None
    """``--max-turns``: ``agentloop.max_turns``."""
    max_new_tokens: int | None = None
    """``--max-new-tokens``: most tokens a turn (``algorithm.sampling_params.max_new_tokens``)."""


@dataclass(frozen=True)
class EvalSettings:
    """The agent loop and search tool an eval runs, and where they came from."""

    loop: AgentLoopConfig
    """Greedy sampling, the training run's limits and protocol, the overrides applied."""
    search: SearchToolConfig
    """The training run's ``tools.search`` pointed at the eval's server."""
    source: Path | None
    """The training config read; None: none was found and the defaults apply."""
    notes: tuple[str, ...]
    """One line per flag that differs from the training run (printed before the eval starts)."""


def check_model_dir(model: str) -> Path:
    """``model`` as a folder holding a Hugging Face model, or ``CheckpointNotFound`` in one line that lists the
    checkpoints its run does have (a run's steps are not always the ones a command names)."""
    path = Path(model)
    if (path / "config.json").is_file():
        return path
    run = next((p for p in (path, *path.parents) if (p / "checkpoints").is_dir() or p.name == "checkpoints"), None)
    found = []
    if run is not None:
        checkpoints = run if run.name == "checkpoints" else run / "checkpoints"
        found = sorted((p.name for p in checkpoints.glob("global_step_*") if (p / "hf_model").is_dir()),
                       key=lambda name: int(name.rsplit("_", 1)[1]) if name.rsplit("_", 1)[1].isdigit() else -1)
    hint = f"; this run has {', '.join(found)} (each with hf_model/)" if found else ""
    what = "no such folder" if not path.exists() else "no config.json there (not a Hugging Face model folder)"
    raise CheckpointNotFound(f"--model {model}: {what}{hint}")


def find_training_config(model_dir: Path) -> Path | None:
    """The training run's ``config.yaml`` in the model's folder or up to three folders above it, or None."""
    for folder in [model_dir, *model_dir.resolve().parents][:_SEARCH_UP]:
        candidate = folder / TRAINING_CONFIG
        if candidate.is_file():
            loaded = yaml.safe_load(candidate.read_text())
            if isinstance(loaded, dict) and ("agentloop" in loaded or "tools" in loaded):
                return candidate
    return None


def eval_settings(model_dir: Path, server_addr: str, overrides: EvalOverrides) -> EvalSettings:
    """The eval's loop and tool: the training run's where its config is found, each override applied on top."""
    source = find_training_config(model_dir)
    # Without a training config: the defaults (AgentLoopConfig's turn budget is SamplingParams.max_new_tokens).
    base_search, base_loop = (SearchToolConfig(), AgentLoopConfig()) if source is None else _training_agent(source)
    trained = {"topk": base_search.topk, "protocol": base_loop.protocol, "max_turns": base_loop.max_turns,
               "max_new_tokens": base_loop.max_tokens_per_turn}
    chosen = {name: trained[name] if getattr(overrides, name) is None else getattr(overrides, name)
              for name in trained}
    flags = {"topk": ("--topk", "tools.search.topk"), "protocol": ("--protocol", "agent.protocol"),
             "max_turns": ("--max-turns", "agentloop.max_turns"),
             "max_new_tokens": ("--max-new-tokens", "algorithm.sampling_params.max_new_tokens")}
    notes = tuple(f"{flags[name][0]} {chosen[name]} differs from the training run's {flags[name][1]} "
                  f"{trained[name]} ({source}): the model is scored on settings it was not trained on"
                  for name in trained if source is not None and chosen[name] != trained[name])
    # Every question is scored: the training run's prompt limit decided which prompts it trained on, not which
    # questions an eval may ask (a longer prompt is rolled out, not refused).
    loop = replace(base_loop, topk=chosen["topk"], protocol=chosen["protocol"], max_turns=chosen["max_turns"],
                   max_tokens_per_turn=chosen["max_new_tokens"], sampling=SamplingParams(greedy=True),
                   max_prompt_tokens=None)
    search = base_search.replace(server_addr=server_addr, topk=chosen["topk"], num_workers=0)
    return EvalSettings(loop=loop, search=search, source=source, notes=notes)


def _training_agent(path: Path) -> tuple[SearchToolConfig, AgentLoopConfig]:
    """``tools.search`` and the agent loop as the training run built them from its saved config."""
    try:
        parsed = parse_config(TrainConfigFile, resolve_raw(yaml.safe_load(path.read_text()), schema=SCHEMA))
        seq_length = parsed.runner.seq_length
        sampling = sampling_params(parsed.algorithm.sampling_params)
        return agent_loop(parsed, sampling, limit=prompt_limit(parsed.data, seq_length=seq_length),
                          seq_length=seq_length)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None

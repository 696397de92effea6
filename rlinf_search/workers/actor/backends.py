"""Training backends by ``actor.training_backend`` name: which trainer class, and what it needs to run.

Trainer classes are named by dotted path and imported when built, so choosing ``fsdp`` never imports
megatron-core. ``require_training_backend`` runs on the driver once the cluster is known, before any
worker starts: a GPU recipe validates anywhere, and fails to start, in one line, where it cannot run.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from rlinf_search.plugins import import_callable
from rlinf_search.registry import Registry
from rlinf_search.workers.actor.config import ActorConfig


class BackendUnavailable(RuntimeError):
    """The configured training backend cannot run here (a package or the GPUs are missing)."""


@dataclass(frozen=True)
class TrainingBackend:
    """One entry of the registry."""

    trainer: str
    """Dotted path of the trainer class (``PolicyTrainer``'s interface), imported when built."""
    needs_cuda: bool = False
    """The backend cannot run on CPU devices."""
    requires: tuple[str, ...] = ()
    """Modules that must import (checked by ``importlib.util.find_spec``, without importing them)."""
    install_hint: str = ""
    """What to install when a required module is missing."""


TRAINING_BACKENDS: Registry[TrainingBackend] = Registry("training backend")
"""Training backends by the name ``actor.training_backend`` uses, or a dotted path to a trainer class of your
own (``PolicyTrainer``'s interface); such a class may say what it needs to run in class attributes
``needs_cuda``, ``requires`` and ``install_hint`` (as ``TrainingBackend`` fields), else it needs nothing."""
TRAINING_BACKENDS.register("fsdp", TrainingBackend(trainer="rlinf_search.workers.actor.policy_trainer:FSDPPolicyTrainer"))
TRAINING_BACKENDS.register("ddp", TrainingBackend(trainer="rlinf_search.workers.actor.policy_trainer:PolicyTrainer"))
TRAINING_BACKENDS.register("megatron", TrainingBackend(
    trainer="rlinf_search.workers.actor.megatron.trainer:MegatronPolicyTrainer", needs_cuda=True,
    requires=("megatron.core",), install_hint="pip install -e '.[megatron]' (megatron-core)"))


def training_backend(name: str) -> TrainingBackend:
    """The registry entry of ``actor.training_backend``, or one made from the trainer class its dotted path names."""
    entry = TRAINING_BACKENDS.resolve(name, key="actor.training_backend")
    if isinstance(entry, TrainingBackend):
        return entry
    return TrainingBackend(trainer=name, needs_cuda=bool(getattr(entry, "needs_cuda", False)),
                           requires=tuple(getattr(entry, "requires", ())),
                           install_hint=str(getattr(entry, "install_hint", "")))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def require_training_backend(config: ActorConfig, *, device_kind: str, actor_ranks: int) -> None:
    """Raise ``BackendUnavailable`` (one line) unless ``config.training_backend`` can run on this cluster:
    ``actor_ranks`` devices of kind ``device_kind`` (``cpu`` or ``cuda``)."""
    name = config.training_backend
    backend = training_backend(name)
    missing = [module for module in backend.requires if not _importable(module)]
    if missing:
        raise BackendUnavailable(f"actor.training_backend {name} needs {', '.join(missing)}: "
                                 f"{backend.install_hint}")
    if backend.needs_cuda and device_kind != "cuda":
        raise BackendUnavailable(f"actor.training_backend {name} runs on GPUs only and this cluster has none; "
                                 "use actor.training_backend: fsdp or ddp on CPU")
    tensor_parallel = config.megatron.tensor_model_parallel_size if config.megatron else 1
    if actor_ranks % tensor_parallel:
        raise BackendUnavailable(f"actor.model.tensor_model_parallel_size {tensor_parallel} must divide the "
                                 f"actor's {actor_ranks} devices (cluster.component_placement)")


def build_trainer(config: ActorConfig):
    """The trainer of ``config.training_backend``, built from ``config``."""
    backend = training_backend(config.training_backend)
    return import_callable(backend.trainer, kind="training backend")(config)

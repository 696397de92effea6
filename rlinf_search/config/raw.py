"""From a YAML (a Hydra ``DictConfig`` or a dict) to the plain dict the section readers walk: resolvers
registered, interpolations resolved, RLinf's keys mapped onto ours, deprecated keys renamed."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlinf_search.config.rlinf import adapt_rlinf_config, is_rlinf_config
from rlinf_search.config.schema import SCHEMA, ConfigError, apply_deprecations

log = logging.getLogger(__name__)


def register_resolvers() -> None:
    """The resolvers RLinf configs use: arithmetic (``${subtract:${runner.seq_length},128}``) and ``not``
    (``return_logprobs: ${not:${algorithm.recompute_logprobs}}``)."""
    resolvers = {"subtract": lambda a, b: a - b, "add": lambda a, b: a + b,
                 "multiply": lambda a, b: a * b, "int_div": lambda a, b: int(a) // int(b),
                 "not": lambda value: not bool(value)}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def resolve_raw(cfg: DictConfig | dict, *, schema: dict) -> dict:
    """The config as a plain dict with every interpolation resolved, RLinf's keys mapped onto ours
    (``config/rlinf.py``) and deprecated keys renamed. An OmegaConf error (an unknown resolver, a missing
    key in ``${...}``) becomes a one-line ``ConfigError`` naming the key. ``schema``: the keys the run
    reads (training's ``SCHEMA`` or the eval's)."""
    register_resolvers()
    try:
        raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{key}: {message}" if key else message) from None
    if is_rlinf_config(raw):
        adapt_rlinf_config(raw, schema=schema, training_schema=SCHEMA)
        _use_local_gpus(raw)
    apply_deprecations(raw)
    return raw


def _use_local_gpus(raw: dict) -> None:
    """RLinf places components on the GPUs Ray finds; so does an RLinf config here when it does not say
    ``cluster.num_gpus_per_node`` (on a machine without GPUs the placement stays on CPU slots)."""
    cluster = raw.setdefault("cluster", {})
    if cluster.get("num_gpus_per_node") is None:
        import torch

        if torch.cuda.is_available():
            cluster["num_gpus_per_node"] = torch.cuda.device_count()
            log.warning("cluster.num_gpus_per_node: %d (the GPUs of this node)", cluster["num_gpus_per_node"])

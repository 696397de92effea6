"""A recipe file composed as ``main_searchr1.py --config-name`` composes it, for code that is handed a
path: its defaults list (the shared groups beside it) merged in, then ``overrides`` applied."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def compose_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The recipe at ``path`` with ``key=value`` ``overrides``; raises ``FileNotFoundError`` when absent."""
    from hydra import compose, initialize_config_dir

    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"config not found: {path}")
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        cfg = compose(config_name=path.stem, overrides=list(overrides))
    OmegaConf.set_struct(cfg, False)  # callers edit it as they would a loaded YAML file
    return cfg

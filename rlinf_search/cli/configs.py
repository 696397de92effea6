"""Finding a recipe by name or path and composing it with overrides, as every config-taking command does.

A recipe is a YAML file (``path/to/run.yaml``) or the name of one in ``examples/searchr1/config`` of this checkout
(``tiny-cpu``, ``qwen2.5-3b-tool-fsdp-1node``): the names ``main_searchr1.py --config-name`` takes. Composing
goes through Hydra's compose API (the recipe's defaults list, then ``key=value`` overrides), which writes nothing:
no run folder in the current directory.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlinf_search.config.schema import ConfigError

EXAMPLE_CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "searchr1" / "config"
"""The recipes of this checkout (absent from an installed wheel: give a path there)."""


def recipe_names() -> list[str]:
    """The recipe names this checkout has."""
    return sorted(p.stem for p in EXAMPLE_CONFIGS.glob("*.yaml")) if EXAMPLE_CONFIGS.is_dir() else []


def recipe_path(config: str) -> Path:
    """``config`` as a file: a YAML path, or a recipe name of this checkout; else a one-line ``ConfigError``."""
    path = Path(config)
    if path.suffix in (".yaml", ".yml"):
        if path.is_file():
            return path.resolve()
        raise ConfigError(f"config {config}: no such file")
    named = EXAMPLE_CONFIGS / f"{config}.yaml"
    if named.is_file():
        return named
    raise ConfigError(f"config {config}: not a YAML file and not a recipe of examples/searchr1/config "
                      f"({', '.join(recipe_names()) or 'none in this install'})")


def compose(config: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The recipe ``config`` with its defaults list merged and ``overrides`` (``key=value``) applied; a missing
    file, a bad override or an unknown group is one ``ConfigError`` line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rlinf_search.config.raw import register_resolvers
    from rlinf_search.recipe_loader import compose_recipe

    register_resolvers()
    path = recipe_path(config)
    overrides = list(overrides)
    while True:
        try:
            return compose_recipe(path, overrides)
        except (HydraException, OmegaConfBaseException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            added = _added(overrides, first)
            if added is None:
                raise ConfigError(f"config {config}: {first}") from None
            overrides = added


def _added(overrides: list[str], message: str) -> list[str] | None:
    """Hydra refuses ``key=value`` for a key the recipe lacks ("Could not override 'key'"), which says nothing of a
    misspelling; the override retried as ``++key=value`` (add or override) lets validation name the key and the
    nearest real one. Every override of that key is retried so: a later one overrides an earlier one, as for a key
    the recipe has (``+`` would refuse the second). None: not that error."""
    prefix = "Could not override '"
    if not message.startswith(prefix):
        return None
    key = message[len(prefix):].split("'", 1)[0]
    matches = [i for i, item in enumerate(overrides) if item.startswith(f"{key}=")]
    if not matches:
        return None
    return [f"++{item}" if i in matches else item for i, item in enumerate(overrides)]

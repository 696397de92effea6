"""Config: the YAML RLinf users know, checked once at start-up and handed out as typed views.

- ``model.py``: every key, in one pydantic model tree shaped like the YAML (type, range, default, meaning).
- ``readers.py``: the resolved config parsed by that model, and a plugin's section by its own settings model.
- ``schema.py``: the accepted keys as a tree (``SCHEMA``, from the model), renamed and removed keys, ``ConfigError``.
- ``raw.py``: resolvers, interpolation, RLinf configs mapped (``rlinf.py``), deprecations.
- ``sections.py``: the sections a training run and an eval share (sampling, rollout, agent loop,
  cluster, reward, prompt limits, data paths).
- ``training.py``: the actor's and critic's views; ``runner.py``: ``RunnerConfig``; ``run_config.py``:
  ``RunConfig``; ``run.py``: ``validate_cfg``; ``eval.py``: ``EvalConfig`` and ``validate_eval_cfg``.

Each key's type, range and default are written once, on its field of the model; the readers read the parsed model
and build each worker's view from it.
"""

from rlinf_search.config.raw import register_resolvers
from rlinf_search.config.run import RunConfig, RunnerConfig, validate_cfg
from rlinf_search.config.schema import DEPRECATED_KEYS, REMOVED_KEYS, SCHEMA, ConfigError

__all__ = ["ConfigError", "DEPRECATED_KEYS", "REMOVED_KEYS", "SCHEMA", "RunConfig", "RunnerConfig",
           "register_resolvers", "validate_cfg"]

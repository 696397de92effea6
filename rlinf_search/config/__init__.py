"""Config: the YAML RLinf users know, checked once at start-up and handed out as typed views.

- ``schema.py``: the accepted keys (``SCHEMA``), renamed and removed keys, ``ConfigError``.
- ``readers.py``: a section read into its view by the fields' declarations (``read_view``), and one typed value
  per dotted key (``get_int(raw, "runner.max_steps", ...)``) where a key is combined with others.
- ``raw.py``: resolvers, interpolation, RLinf configs mapped (``rlinf.py``), deprecations.
- ``sections.py``: the sections a training run and an eval share (sampling, rollout, agent loop,
  cluster, reward, prompt limits, data paths).
- ``training.py``: the actor's and critic's views; ``runner.py``: ``RunnerConfig``; ``run_config.py``:
  ``RunConfig``; ``run.py``: ``validate_cfg``; ``eval.py``: ``EvalConfig`` and ``validate_eval_cfg``.

Each key's default is written once, as the field default of the typed view it fills (``declared``); a reader
is handed that field (``RunnerConfig.max_steps``), and ``tests/test_config_defaults.py`` fails on a second
literal.
"""

from rlinf_search.config.raw import register_resolvers
from rlinf_search.config.run import RunConfig, RunnerConfig, validate_cfg
from rlinf_search.config.schema import DEPRECATED_KEYS, REMOVED_KEYS, SCHEMA, ConfigError

__all__ = ["ConfigError", "DEPRECATED_KEYS", "REMOVED_KEYS", "SCHEMA", "RunConfig", "RunnerConfig",
           "register_resolvers", "validate_cfg"]

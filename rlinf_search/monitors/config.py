"""``MonitorsConfig``: the ``monitors`` section, the thresholds of the collapse monitors (``monitors/rules.py``).

The defaults never fired on the demo's healthy runs and fire on a run driven to collapse (docs/results.md,
"Collapse monitors"); a relative threshold is a share of the metric's mean over the run's first
``baseline_steps`` steps, so one set of defaults fits a tiny model and a 3B one.
"""

from __future__ import annotations

from pydantic import Field

from rlinf_search.section_model import ConfigSection


class MonitorsConfig(ConfigSection):
    """``monitors``: when each collapse monitor fires, and which firings stop the run."""

    config_path = "monitors"

    enabled: bool = True
    """Watch the run (a line when a monitor fires; ``monitor/<name>`` in the metrics)."""
    stop_on: tuple[str, ...] = ()
    """Monitors whose firing stops the run before that step's checkpoint is written (``all``: every one). The
    last checkpoint before the collapse stays; the stop line names it."""
    baseline_steps: int = Field(3, ge=1)
    """Steps whose mean is a relative threshold's baseline (the first ones the metric was logged in)."""
    patience: int = Field(2, ge=1)
    """Consecutive steps a threshold must be crossed before its monitor fires (one noisy step is not a collapse)."""
    entropy_floor: float = Field(0.25, gt=0, lt=1)
    """``entropy``: ``actor/entropy`` below this share of its baseline."""
    search_zero_steps: int = Field(3, ge=1)
    """``searches``: no search in a whole step for this many steps in a row, in a run whose baseline searched."""
    length_floor: float = Field(0.25, gt=0, lt=1)
    """``length``: ``rollout/response_length`` below this share of its baseline."""
    repetition_max: float = Field(0.5, gt=0, le=1)
    """``repetition``: ``rollout/repetition_share`` (repeated word 3-grams in what the policy wrote) above this."""
    format_violation_max: float = Field(0.5, gt=0, le=1)
    """``format``: ``rollout/format_violation_rate`` (no answer, or a tag left open) above this."""
    retrieval_hit_floor: float = Field(0.3, gt=0, lt=1)
    """``retrieval``: ``rollout/retrieval_hit_rate`` (search results holding a gold answer) below this share of its
    baseline."""
    kl_max: float = Field(1.0, gt=0)
    """``kl``: ``actor/kl`` (to the reference policy) above this."""
    clip_fraction_max: float = Field(0.3, gt=0, le=1)
    """``clip``: ``actor/clip_fraction`` above this."""
    is_weight_max: float = Field(20.0, gt=1)
    """``is_weight``: the largest importance weight a step logged (``actor/lag_<n>/is_weight_max``) above this."""

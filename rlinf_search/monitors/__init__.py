"""Collapse monitors: per-step rules that say in one line when a run is collapsing, and stop it where the config
says so (``monitors/rules.py``; thresholds in ``monitors/config.py``)."""

from rlinf_search.monitors.config import MonitorsConfig
from rlinf_search.monitors.rules import MONITORS, CollapseWatch, Firing, Monitor, check_stop_on, replay

__all__ = ["MONITORS", "CollapseWatch", "Firing", "Monitor", "MonitorsConfig", "check_stop_on", "replay"]

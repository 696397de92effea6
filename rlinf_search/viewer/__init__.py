"""``rlinf-search view RUN_DIR``: a run's trajectories and curves in the browser."""

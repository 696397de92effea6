"""Ablations: arms (sets of overrides) x seeds from one warm start, run as a Hydra multirun, reported with their
spread beside the published finding (``rlinf-search ablate``)."""

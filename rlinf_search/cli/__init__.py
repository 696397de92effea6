"""The ``rlinf-search`` command (``cli/app.py``)."""

from rlinf_search.cli.app import app, main

__all__ = ["app", "main"]

"""``python -m rlinf_search.cli``: the ``rlinf-search`` command where the console script is not on PATH."""

from rlinf_search.cli.app import main

main()

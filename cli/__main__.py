"""``python -m cli``: the ``kiln`` command."""

from cli.main import main

main()

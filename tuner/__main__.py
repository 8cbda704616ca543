"""``python -m tuner``: the same as the ``tune`` command."""

from tuner.cli import main

main()

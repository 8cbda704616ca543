"""``python -m prefill_tuner``: the same as the ``tune`` command."""

from prefill_tuner.cli import main

main()

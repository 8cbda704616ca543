"""``python -m prefill_tuner``: the same as the ``tune`` command."""

from prefill_tuner.entry import main

main()

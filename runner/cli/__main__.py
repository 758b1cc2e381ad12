"""``python -m runner.cli``: the same as the ``latchwork`` command."""

from runner.cli import main

main()

"""``python -m aiobk``: the same as the ``aiobk`` command."""

from aiobk.cli import main

main()

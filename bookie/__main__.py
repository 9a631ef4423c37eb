"""``python -m aiobk.bookie`` runs the bookie commands alone (``aiobk bookie ...``).

The one import of the wiring layer from inside ``bookie/``: an entry point, not library code
(declared as an exception in the import-linter contracts, pyproject.toml)."""

from aiobk.commands.bookie import bookie_group
from aiobk.commands.common import run_group

if __name__ == "__main__":
    run_group(bookie_group, "python -m aiobk.bookie")

"""``python -m aiobk.bookie`` runs the bookie commands alone."""

from aiobk.bookie.cli import bookie_group, run_group

if __name__ == "__main__":
    run_group(bookie_group, "python -m aiobk.bookie")

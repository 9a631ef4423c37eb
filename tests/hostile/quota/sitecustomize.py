"""Loaded at interpreter start (through PYTHONPATH) by a bookie process under test on a
simulated small disk: see ``tests/hostile/small_disk.py``. Does nothing without its variable."""

import os

if os.environ.get("AIOBK_TEST_DISK_QUOTA"):
    from tests.hostile.small_disk import install

    install(os.environ["AIOBK_TEST_DISK_QUOTA"])

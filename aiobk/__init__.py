"""The ``aiobk`` command line (assembles the commands of each package)."""

__all__: list[str] = []
